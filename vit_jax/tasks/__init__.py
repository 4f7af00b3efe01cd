"""What a run optimises and how it is scored: `Task` (task.py), chosen once from `config.loss`
by `get_task`; the losses (losses.py), mixup (mixup.py), classification's steps
(classification.py) and masked patch prediction (mpp.py). This package sits below `train` and
`serving`: it imports only `models` and its own modules."""

from vit_jax.tasks.task import CHOICES, MPP, Task, get_task

__all__ = ['CHOICES', 'MPP', 'Task', 'get_task']
