"""vit_jax: Vision Transformer (ViT) and hybrid models in JAX/Flax. Pinned, tested versions: requirements.lock."""

from setuptools import find_packages, setup

setup(
    name='vit_jax',
    version='0.1.0',
    description='Vision Transformer and hybrid models in JAX/Flax, exact to the original',
    packages=find_packages(include=['vit_jax', 'vit_jax.*']),
    python_requires='>=3.11',
    # `vit-jax <command> [flags]`, the same as `python -m vit_jax <command> [flags]`.
    entry_points={'console_scripts': ['vit-jax = vit_jax.__main__:main']},
    install_requires=[
        'jax>=0.10', 'flax>=0.12', 'optax>=0.2.8', 'orbax-checkpoint>=0.12',
        'tensorflow-cpu>=2.21', 'tensorflow-datasets>=4.9.10', 'ml-collections>=1.1',
        'mlxtend>=0.25', 'tensorboard>=2.21', 'matplotlib', 'pillow>=10.1', 'numpy', 'scipy',
        'absl-py', 'safetensors>=0.8', 'filelock>=3',
    ],
    # Accelerators: the JAX wheels matching the tested jax 0.10.2 (requirements.lock pins the CPU
    # build). `pip install -e '.[tpu]'` on a Cloud TPU VM; '.[cuda12]' or '.[cuda13]' on a GPU
    # (`make install ACCEL=cuda13` installs the same packages hash-pinned: requirements-cuda13.lock).
    extras_require={
        'test': ['pytest', 'pytest-xdist'],
        'tpu': ['jax[tpu]==0.10.2'],
        'cuda12': ['jax[cuda12]==0.10.2'],
        'cuda13': ['jax[cuda13]==0.10.2'],
    },
)
