"""Run housekeeping, apart from the science in vit_jax/train: the workdir's lock (`lock`) and
checks (`workdir`), the guards that keep a run safe (`guards`: preemption, non-finite numbers,
config drift on resume), its logs (`logs`, `events`: JSONL and TensorBoard; `curve`: the
training curve figure) and the host-side feed of batches to the devices (`feed`)."""
