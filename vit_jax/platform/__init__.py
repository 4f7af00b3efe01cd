"""Everything specific to where the code runs, in one place: huge-page malloc for command-line
runs (`hostmem`), the persistent XLA compilation cache (`compile_cache`), TensorFlow imported
quietly and only when needed (`tf_import`), the processor cores this process may use (`cpus`),
and the accelerators' own settings and facts (`chips`, `gpu`)."""
