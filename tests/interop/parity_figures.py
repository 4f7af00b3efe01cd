"""The measured parity figures, (model, direction, max relative logit error), filled by the tests
and printed in the terminal summary by conftest.py."""

FIGURES = []
