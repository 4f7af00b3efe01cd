"""Everything specific to where the code runs: host memory and garbage-collector settings, XLA
flags per backend, the compilation cache, the CPU-specific model forms and the table of known
chips (peak FLOP/s, memory) used for MFU and memory plans."""
