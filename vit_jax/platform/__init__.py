"""Everything specific to where the code runs, in one place: huge-page malloc for command-line
runs (`hostmem`), the persistent XLA compilation cache (`compile_cache`), TensorFlow imported
quietly and only when needed (`tf_import`), the processor (`cpus`: its usable cores, model and
vector extensions), the one chip table and device line (`chips`), NVIDIA GPUs' probes and XLA
flags (`gpu`), and compiling for a TPU slice or a GPU that is not here (`targets`)."""
