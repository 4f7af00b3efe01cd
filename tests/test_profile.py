"""The kernel profile: FLOPs read from compiled HLO against closed forms, op names to components,
trace events to per-step rows."""

import jax
import jax.numpy as jnp
import pytest

from vit_jax.tools.benchmarking import profile


def _entry_flops(fn, *args) -> float:
  text = jax.jit(fn).lower(*args).compile().as_text()
  instrs, comps = profile.parse_hlo(text), profile.computations(text)
  entry = [name for name in comps if name.startswith('main')]
  assert len(entry) == 1, list(comps)
  return sum(profile.kernel_flops(name, instrs, comps) for name in comps[entry[0]])


def test_matmul_flops_inside_a_fusion():
  a, b = jnp.ones((64, 96)), jnp.ones((96, 40))
  assert _entry_flops(lambda a, b: jnp.tanh(a @ b) + 1., a, b) == 2 * 64 * 96 * 40


def test_convolution_flops_forward_and_backward():
  x, k = jnp.ones((2, 32, 32, 3)), jnp.ones((4, 4, 3, 8))
  conv = lambda x, k: jax.lax.conv_general_dilated(
      x, k, (4, 4), 'VALID', dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
  forward = 2 * (2 * 8 * 8 * 8) * (4 * 4 * 3)  # 2 x outputs x (kernel window x input channels)
  assert _entry_flops(conv, x, k) == forward
  # The kernel gradient is one more convolution of the same size.
  grad = jax.grad(lambda x, k: jnp.sum(conv(x, k) ** 2), argnums=1)
  assert _entry_flops(grad, x, k) == 2 * forward


@pytest.mark.parametrize('op_name,expected', [
    ('jit(f)/VisionTransformer/Transformer/encoderblock_3/MultiHeadDotProductAttention_0/query/'
     'dot_general', ('forward', 'q/k/v projections')),
    ('jit(f)/transpose(jvp(VisionTransformer))/Transformer/encoderblock_0/'
     'MultiHeadDotProductAttention_0/bhqk,bhkd->bhqd/dot_general',
     ('backward', 'attention core (QK, softmax, AV)')),
    ('jit(f)/jvp(VisionTransformer)/Transformer/encoderblock_11/MlpBlock_0/Dense_1/dot_general',
     ('forward', 'MLP Dense_1')),
    ('jit(f)/jvp(VisionTransformer)/Transformer/encoderblock_1/MlpBlock_0/tanh',
     ('forward', 'GELU')),
    ('jit(f)/transpose(jvp(VisionTransformer))/Transformer/encoder_norm/mul',
     ('backward', 'LayerNorm')),
    ('jit(f)/jvp(VisionTransformer)/embedding/conv_general_dilated',
     ('forward', 'patch embedding')),
    ('jit(f)/mul', ('optimizer, loss, other', '-')),
])
def test_op_names_map_to_phase_and_component(op_name, expected):
  assert profile.classify(op_name) == expected


def test_events_sum_per_component_and_step():
  text = jax.jit(lambda a, b: jnp.tanh(a @ b)).lower(
      jnp.ones((8, 16)), jnp.ones((16, 4))).compile().as_text()
  instrs = profile.parse_hlo(text)
  kernels = [name for name, ins in instrs.items() if ins.opcode == 'fusion']
  assert kernels
  events = [{'ph': 'X', 'name': kernels[0], 'dur': 3000.}, {'ph': 'X', 'name': kernels[0],
                                                            'dur': 1000.},
            {'ph': 'X', 'name': 'not-a-kernel', 'dur': 9e9}, {'ph': 'M', 'name': kernels[0]}]
  summary = profile.summarize(events, text, steps=2)
  assert summary['kernel_ms_per_step'] == pytest.approx(2.)  # (3 + 1) ms over 2 steps
  (row,) = summary['rows']
  assert row['share'] == 1. and row['kernels'] == 1
  assert row['gflop_per_step'] == pytest.approx(2 * 8 * 16 * 4 / 1e9)


# Kernel names as the profilers report them on an H100/H200 (cuBLAS, cuDNN, PyTorch's CUDA
# kernels, torch.compile's Triton kernels, XLA:GPU's fusions) and ATen ops on a CPU.
@pytest.mark.parametrize('name, expected', [
    ('sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cgasize1x2x1_warpgroupsize2x1x1_'
     'execute_segment_k_off_kernel__5x_cublas', 'GEMM'),
    ('nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT', 'GEMM'),
    ('sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize128x128x128_warpgroupsize1x1x1', 'GEMM'),
    ('void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>'
     '(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8::Params)', 'GEMM'),
    ('triton_tem_fused_addmm_gelu_1', 'GEMM'),
    ('gemm_fusion_dot_45', 'GEMM'),
    ('aten::addmm', 'GEMM'), ('aten::bmm', 'GEMM'), ('aten::mkldnn_convolution', 'GEMM'),
    ('cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_'
     'kernel0_0', 'attention'),
    ('void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, '
     'cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, '
     'false, false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)',
     'attention'),
    ('fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<'
     'cutlass::bfloat16_t, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)',
     'attention'),
    ('aten::_scaled_dot_product_flash_attention_for_cpu', 'attention'),
    ('void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>'
     '(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, '
     'float*, c10::BFloat16*)', 'LayerNorm'),
    ('void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel_32x32<float, float>',
     'LayerNorm'),
    ('triton_red_fused_native_layer_norm_native_layer_norm_backward_7', 'LayerNorm'),
    ('aten::native_layer_norm', 'LayerNorm'),
    ('void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl('
     'at::TensorIteratorBase&, at::native::GeluType)::{lambda()#' '2}, at::detail::Array<char*, 2> >',
     'GELU and other elementwise'),
    ('triton_poi_fused_gelu_gelu_backward_12', 'GELU and other elementwise'),
    ('triton_poi_fused__to_copy_add_5', 'GELU and other elementwise'),  # a dtype cast
    ('loop_add_fusion_3', 'GELU and other elementwise'),
    ('loop_convert_fusion_1', 'GELU and other elementwise'),
    ('input_reduce_fusion_12', 'GELU and other elementwise'),
    ('void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, true, false>'
     '(float*, float const*, int, int, int, bool const*, int, bool)', 'softmax'),
    ('triton_per_fused__softmax_3', 'softmax'), ('aten::_log_softmax', 'softmax'),
    ('void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous '
     'namespace)::FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::'
     'FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, double*, double, double, '
     'double, double, double, bool, float*, float*>', 'optimizer'),
    ('void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous '
     'namespace)::TensorListMetadata<1>, at::native::(anonymous namespace)::LpNormFunctor<float, '
     '(at::native::(anonymous namespace)::NormType)1, float, float>, float*, int>', 'optimizer'),
    ('aten::_foreach_mul_', 'optimizer'),
    ('void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::'
     'direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#' '3}>>', 'copies/transposes'),
    ('Memcpy DtoD (Device -> Device)', 'copies/transposes'),
    ('triton_poi_fused_clone_4', 'copies/transposes'),
    ('loop_transpose_fusion_2', 'copies/transposes'), ('wrapped_transpose_1', 'copies/transposes'),
    ('input_concatenate_fusion', 'copies/transposes'),
    ('loop_dynamic_update_slice_fusion', 'copies/transposes'),
    ('loop_pad_fusion', 'padding'), ('triton_poi_fused_constant_pad_nd_0', 'padding'),
    ('aten::constant_pad_nd', 'padding'),
    ('aten::view', 'other'),
])
def test_kernel_names_map_to_their_class(name, expected):
  assert profile.kernel_class(name) == expected


@pytest.mark.parametrize('name, context, expected', [
    # An optimizer step owns its kernels, whatever they are.
    ('void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float, float, '
     'float, at::native::binary_internal::MulFunctor<float> > >',
     ['Optimizer.step#AdamW.step', 'aten::_foreach_mul_'], 'optimizer'),
    # A LayerNorm backward's reductions are LayerNorm's; a GEMM inside it stays a GEMM.
    ('void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::WelfordOps>>',
     ['autograd::engine::evaluate_function: NativeLayerNormBackward0', 'NativeLayerNormBackward0',
      'aten::native_layer_norm_backward'], 'LayerNorm'),
    ('sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n', ['NativeLayerNormBackward0'], 'GEMM'),
    # Unfused attention (PyTorch's math path): its GEMMs and softmax are attention, as our einsum
    # kernel's; its data movement stays copies.
    ('sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n', ['aten::scaled_dot_product_attention',
                                                  'aten::_scaled_dot_product_attention_math',
                                                  'aten::bmm'], 'attention'),
    ('void (anonymous namespace)::softmax_warp_forward<float>', [
        'aten::scaled_dot_product_attention', 'aten::_softmax'], 'attention'),
    ('Memcpy DtoD (Device -> Device)', ['aten::scaled_dot_product_attention', 'aten::contiguous',
                                        'aten::clone', 'aten::copy_'], 'copies/transposes'),
    ('sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n', ['aten::linear', 'aten::addmm'], 'GEMM'),
    ('aten::mul', ['Optimizer.step#Adam.step'], 'optimizer'),
])
def test_the_ops_around_a_kernel_name_its_class(name, context, expected):
  assert profile.kernel_class(name, context) == expected


# Top-level instructions of an XLA:GPU train step, as its compiled HLO names them.
_GPU_HLO = '''\
HloModule jit_wrapped

%fused_transpose (p0: bf16[256,197,12,64]) -> bf16[256,12,197,64] {
  %p0 = bf16[256,197,12,64]{3,2,1,0} parameter(0)
  ROOT %transpose.1 = bf16[256,12,197,64]{3,2,1,0} transpose(%p0), dimensions={0,2,1,3}
}

%fused_pad (p0: bf16[256,12,197,64]) -> bf16[256,12,200,64] {
  %p0 = bf16[256,12,197,64]{3,2,1,0} parameter(0)
  %c = bf16[] constant(0)
  ROOT %pad.1 = bf16[256,12,200,64]{3,2,1,0} pad(%p0, %c), padding=0_0x0_0x0_3x0_0
}

%fused_gelu (p0: bf16[50432,3072]) -> bf16[50432,3072] {
  %p0 = bf16[50432,3072]{1,0} parameter(0)
  ROOT %tanh.1 = bf16[50432,3072]{1,0} tanh(%p0)
}

%fused_adam (p0: f32[768,3072], p1: f32[768,3072]) -> f32[768,3072] {
  %p0 = f32[768,3072]{1,0} parameter(0)
  %p1 = f32[768,3072]{1,0} parameter(1)
  ROOT %multiply.9 = f32[768,3072]{1,0} multiply(%p0, %p1)
}

%fused_ln (p0: f32[50432,768]) -> f32[50432] {
  %p0 = f32[50432,768]{1,0} parameter(0)
  %c = f32[] constant(0)
  ROOT %reduce.2 = f32[50432]{0} reduce(%p0, %c), dimensions={1}, to_apply=%add
}

ENTRY %main.1 (a: bf16[256,197,12,64], x: bf16[50432,768], w: bf16[768,3072], m: f32[768,3072]) -> f32[768,3072] {
  %a = bf16[256,197,12,64]{3,2,1,0} parameter(0)
  %x = bf16[50432,768]{1,0} parameter(1)
  %w = bf16[768,3072]{1,0} parameter(2)
  %m = f32[768,3072]{1,0} parameter(3)
  %wrapped_transpose = bf16[256,12,197,64]{3,2,1,0} fusion(%a), kind=kLoop, calls=%fused_transpose, metadata={op_name="jit(wrapped)/jvp(VisionTransformer)/Transformer/encoderblock_0/MultiHeadDotProductAttention_0/transpose"}
  %loop_pad_fusion = bf16[256,12,200,64]{3,2,1,0} fusion(%wrapped_transpose), kind=kLoop, calls=%fused_pad, metadata={op_name="jit(wrapped)/jvp(VisionTransformer)/Transformer/encoderblock_0/MultiHeadDotProductAttention_0/pad"}
  %custom-call.3 = (bf16[256,12,200,64]{3,2,1,0}, u8[0]{0}) custom-call(%loop_pad_fusion, %loop_pad_fusion, %loop_pad_fusion), custom_call_target="__cudnn$fmhaSoftmax", metadata={op_name="jit(wrapped)/jvp(VisionTransformer)/Transformer/encoderblock_0/MultiHeadDotProductAttention_0/dot_product_attention"}
  %custom-call.7 = (bf16[50432,3072]{1,0}, s8[33554432]{0}) custom-call(%x, %w), custom_call_target="__cublas$lt$matmul$f8", metadata={op_name="jit(wrapped)/jvp(VisionTransformer)/Transformer/encoderblock_0/MlpBlock_0/Dense_0/Fp8Dot_0/dot_general"}
  %get-tuple-element.7 = bf16[50432,3072]{1,0} get-tuple-element(%custom-call.7), index=0
  %loop_tanh_fusion = bf16[50432,3072]{1,0} fusion(%get-tuple-element.7), kind=kLoop, calls=%fused_gelu, metadata={op_name="jit(wrapped)/jvp(VisionTransformer)/Transformer/encoderblock_0/MlpBlock_0/tanh"}
  %input_reduce_fusion = f32[50432]{0} fusion(%x), kind=kInput, calls=%fused_ln, metadata={op_name="jit(wrapped)/transpose(jvp(VisionTransformer))/Transformer/encoderblock_0/LayerNorm_1/reduce_sum"}
  ROOT %loop_multiply_fusion = f32[768,3072]{1,0} fusion(%m, %m), kind=kLoop, calls=%fused_adam, metadata={op_name="jit(wrapped)/mul"}
}
'''


def test_our_gpu_kernels_are_classed_by_their_hlo():
  instrs, comps = profile.parse_hlo(_GPU_HLO), profile.computations(_GPU_HLO)
  got = {name: profile.hlo_kernel_class(name, instrs, comps) for name in (
      'wrapped_transpose', 'loop_pad_fusion', 'custom-call.3', 'custom-call.7',
      'loop_tanh_fusion', 'input_reduce_fusion', 'loop_multiply_fusion')}
  assert got == {'wrapped_transpose': 'copies/transposes', 'loop_pad_fusion': 'padding',
                 'custom-call.3': 'attention', 'custom-call.7': 'GEMM',
                 'loop_tanh_fusion': 'GELU and other elementwise',
                 'input_reduce_fusion': 'LayerNorm', 'loop_multiply_fusion': 'optimizer'}


STREAM = 'Stream #' '14(Compute)'  # a stream line's name in XLA's trace


def _gpu_trace(lines):
  """A Perfetto trace as jax.profiler writes it on a GPU: a process per device and the host, a
  thread per line, 'X' events on them."""
  events = [{'ph': 'M', 'name': 'process_name', 'pid': 1, 'args': {'name': '/host:CPU'}},
            {'ph': 'M', 'name': 'process_name', 'pid': 2, 'args': {'name': '/device:GPU:0'}},
            {'ph': 'M', 'name': 'thread_name', 'pid': 1, 'tid': 1, 'args': {'name': 'python'}},
            {'ph': 'X', 'pid': 1, 'tid': 1, 'name': 'loop_tanh_fusion', 'dur': 1e6}]  # host side
  for tid, (thread, kernels) in enumerate(lines.items(), 10):
    events.append({'ph': 'M', 'name': 'thread_name', 'pid': 2, 'tid': tid,
                   'args': {'name': thread}})
    events += [{'ph': 'X', 'pid': 2, 'tid': tid, 'name': name, 'dur': dur, 'args': args}
               for name, dur, args in kernels]
  return events


def test_gpu_traces_join_the_hlo_from_the_xla_ops_line_or_the_streams():
  stream = [('nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT', 4000., {'hlo_op': 'custom-call.7'}),
            ('cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7', 3000., {}),
            ('loop_tanh_fusion', 1000., {}), ('wrapped_transpose', 500., {})]
  ops = [('custom-call.7', 4000., {}), ('%custom-call.3 = (bf16[...]) custom-call(...)', 3000., {}),
         ('loop_tanh_fusion', 1000., {}), ('wrapped_transpose', 500., {})]
  for lines, source in (({STREAM: stream}, "the GPU's stream kernels"),
                        ({STREAM: stream, 'XLA Ops': ops, 'XLA Modules': [
                            ('jit_wrapped', 8500., {})]}, "the GPU's XLA Ops line")):
    summary = profile.summarize(_gpu_trace(lines), _GPU_HLO, steps=2)
    assert summary['source'] == source
    assert summary['kernel_ms_per_step'] == pytest.approx(4.25)  # 8.5 ms over 2 steps
    assert {k: v for k, v in summary['classes'].items() if v} == pytest.approx({
        'GEMM': 2., 'attention': 1.5, 'GELU and other elementwise': .5,
        'copies/transposes': .25})
  # An XLA Ops line that times CUDA graphs (command buffers) says nothing per kernel: the streams.
  graphs = {STREAM: stream, 'XLA Ops': [('command_buffer.3', 8500., {})]}
  assert profile.summarize(_gpu_trace(graphs), _GPU_HLO, steps=2)['classes']['GEMM'] == 2.
  # The stream's cuDNN kernel has no HLO op: filed by its name, outside the model's rows.
  assert ('unmatched (by kernel name)', '-') in {(r['phase'], r['component'])
                                                 for r in profile.summarize(
                                                     _gpu_trace({'Stream #' '7': stream}), _GPU_HLO,
                                                     steps=1)['rows']}


def test_the_class_table_puts_ours_against_theirs():
  ours = {'classes': dict.fromkeys(profile.KERNEL_CLASSES, 0.) | {'GEMM': 3., 'padding': .5},
          'kernel_ms_per_step': 3.5}
  theirs = profile.by_class([('nvjet_x', 'GEMM', 2.), ('triton_poi_fused_gelu_0',
                                                        'GELU and other elementwise', 1.)])
  theirs['kernel_ms_per_step'] = 3.
  assert profile.format_class_table([('ours', ours), ('timm', theirs)]).splitlines() == [
      '| kernel class | ours ms | timm ms | ours - timm |', '|---|---|---|---|',
      '| GEMM | 3.00 | 2.00 | +1.00 |', '| GELU and other elementwise | 0.00 | 1.00 | -1.00 |',
      '| padding | 0.50 | 0.00 | +0.50 |', '| total kernel time | 3.50 | 3.00 | +0.50 |']
