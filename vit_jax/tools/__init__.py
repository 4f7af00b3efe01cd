"""The tool shelf, apart from the research core: sweeps of training runs (`sweeps`), benchmarks
of the step, the input pipeline and timm (`benchmarking`), and launching runs on Cloud TPU VMs
and SLURM (`launch`). The research core never imports them; they sit above `train`."""
