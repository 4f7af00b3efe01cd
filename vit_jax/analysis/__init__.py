"""What the ViT learns: the paper's Figure 7 (embedding filters, position-embedding similarity,
mean attention distance) and attention rollout, as arrays for notebooks and as figures.

  params, config = inputs.load_checkpoint(inputs.resolve_checkpoint(workdir))
  model = inputs.build_model(config, params)
  embedding_pca(params, n=28)                        -> PCA(components [n,p,p,C], ratios, mean)
  posemb_similarity(params, grid, has_cls)           -> [P, P] cosine similarity (cls excluded)
  attention_weights(model, params, images)           -> [L, B, H, N, N]
  mean_attention_distance(attn, grid, patch_pixels)  -> [L, H] pixels
  attention_rollout(attn, has_cls, grid)             -> [B, gh, gw] (rollout_matrix: [B, N, N])

Modules: `embedding` (filters, posemb), `attention` (weights, distance, rollout), `inputs`
(checkpoints and images), `plots` (matplotlib), `report` (all four figures for the CLI).
"""

from vit_jax.analysis import inputs
from vit_jax.analysis.attention import attention_rollout
from vit_jax.analysis.attention import attention_weights
from vit_jax.analysis.attention import cls_attention_share
from vit_jax.analysis.attention import forward_with_attention
from vit_jax.analysis.attention import has_cls_token
from vit_jax.analysis.attention import mean_attention_distance
from vit_jax.analysis.attention import patch_distances
from vit_jax.analysis.attention import rollout_matrix
from vit_jax.analysis.attention import token_grid
from vit_jax.analysis.attention import uniform_attention_distance
from vit_jax.analysis.attention import upsample
from vit_jax.analysis.embedding import PCA
from vit_jax.analysis.embedding import embedding_pca
from vit_jax.analysis.embedding import interior_positions
from vit_jax.analysis.embedding import is_grid_neighbour
from vit_jax.analysis.embedding import kernel_pca
from vit_jax.analysis.embedding import most_similar_other
from vit_jax.analysis.embedding import neighbour_fraction
from vit_jax.analysis.embedding import position_embeddings
from vit_jax.analysis.embedding import posemb_similarity
from vit_jax.analysis.report import write_report

__all__ = [
    'PCA', 'attention_rollout', 'attention_weights', 'cls_attention_share', 'embedding_pca', 'forward_with_attention',
    'has_cls_token', 'inputs', 'interior_positions', 'is_grid_neighbour', 'kernel_pca',
    'mean_attention_distance', 'most_similar_other', 'neighbour_fraction', 'patch_distances',
    'position_embeddings', 'posemb_similarity', 'rollout_matrix', 'token_grid',
    'uniform_attention_distance', 'upsample', 'write_report',
]
