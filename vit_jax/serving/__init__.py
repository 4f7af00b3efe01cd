"""Serving a trained model: inference bundles (`bundle`: params + model spec + preprocessing,
loaded from a workdir, a bundle or a params file) and running them on images (`inference`)."""
