"""The config schema (`common`: every key, its default and meaning), the paper's recipe tables
(`recipes`) and the recipe builders (`mnist5k`, `pretrain`, `finetune`, `plans`).

The files under the checkout's configs/ are the user's: each is a `--config` file whose
`get_config` starts from these.
"""
