"""Test setup: 8 simulated CPU devices, quiet TensorFlow, and shared small fixtures.

Tiers: `make test` runs every test but the system tier, `make test-system` the system tier (real
services, several processes, signals, full disks: SYSTEM_FIXTURES and SYSTEM_TESTS below),
`.ci/run` both; `make test-fast` leaves out the `slow` tests too (SLOW_MODULES, SLOW_FIXTURES). A
new test joins a tier through a fixture or its id in those tables, or its own `@pytest.mark.slow`.
"""

import os

# The suite's programs are tiny and most compile once or twice, so compiling, not running, is
# its CPU time: JAX's -O0 (JAX_DISABLE_MOST_OPTIMIZATIONS below; a flag read at each compile, so
# subprocesses inherit it; `helpers.optimized()` turns it off for a test that trains longer),
# XLA:CPU's older elemental emitters instead of the loop-fusion ones (cheaper to compile, same
# results), LLVM code generation in one piece (the suite keeps every core busy, so splitting it
# over threads only adds work) and LLVM at level 1 where -O0 is off. Subprocesses that set
# another device count keep all of these (`helpers.xla_flags`).
os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                           ' --xla_force_host_platform_device_count=8'
                           ' --xla_cpu_use_fusion_emitters=false'
                           ' --xla_cpu_parallel_codegen_split_count=1'
                           ' --xla_backend_optimization_level=1').strip()
os.environ.setdefault('JAX_DISABLE_MOST_OPTIMIZATIONS', '1')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# One persistent XLA compilation cache for the test run's processes and the subprocesses they
# start: the suite compiles the same small programs many times (each `vit_jax.main` launch of the
# kill loop, each strategy run). A cache hit is the same executable, so results are unchanged.
os.environ.setdefault('JAX_COMPILATION_CACHE_DIR', os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), '.pytest_cache', 'xla'))
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')

import pytest  # pylint: disable=g-import-not-at-top


# Whole modules of subprocess and end-to-end tests, and the fixtures that train or compile for a
# TPU slice: their tests are `slow` without a mark of their own. Other slow tests carry
# @pytest.mark.slow (each measured at 1 CPU-second or more: VIT_JAX_TEST_CPU_LOG below).
SLOW_MODULES = frozenset({
    'test_bad_inputs', 'test_benchmark', 'test_compile_targets', 'test_main', 'test_multiprocess',
    'test_predict', 'test_pretrain_finetune', 'test_reliability', 'test_run_once', 'test_startup', 'test_sweep',
    'test_sweep_study'})
SLOW_FIXTURES = frozenset({'short_run', 'runs', 'tpu_v3_2x2'})


# The system tier (`make test-system`; `make test` leaves it out, `.ci/run` runs both): real
# services (a SLURM cluster, PostgreSQL), several processes of one run, signals and kills sent to
# running trainers and sweeps, file systems that fill up, closed standard streams, a capped
# address space, compiles for TPU slices and GPUs, the script benchmarks/gpu_session.sh. A test
# joins it through a fixture below or its id (`file::name`, parameters included or not).
SYSTEM_FIXTURES = frozenset({'cluster', 'small_disk', 'tiny_disk', 'tpu_reports', 'gpu_report'})
SYSTEM_TESTS = (
    'test_reliability.py::test_kill_9_loop_always_resumes_and_ends_bitwise_exact',
    'test_reliability.py::test_sigterm_at_a_random_step_then_resume_is_bitwise_exact',
    'test_reliability.py::test_sigterm_to_one_of_two_processes_stops_both_at_the_same_step',
    'test_reliability.py::test_sigterm_while_a_two_process_run_resumes_stops_it_at_its_first_step',
    'test_reliability.py::test_ctrl_c_at_random_start_up_moments_always_stops_the_command',
    'test_reliability.py::test_second_ctrl_c_soon_after_the_first_keeps_a_complete_checkpoint',
    'test_reliability_faults.py::test_sighup_saves_like_sigterm_and_every_step_is_in_one_record',
    'test_archive.py::test_sigterm_while_the_input_is_blocked_saves_and_exits',
    'test_archive.py::test_a_signal_while_indexing_is_one_line_and_leaves_no_index_that_is_trusted',
    'test_archive.py::test_the_recipe_trains_20_steps_and_resumes_exactly_after_a_kill',
    'test_predict.py::test_predict_beside_a_run_that_removes_each_checkpoint_as_it_saves_the_next',
    'test_reliability_faults.py::test_a_restore_out_of_memory_stops_with_one_line_and_moves_nothing',
    'test_reliability_faults.py::test_a_restore_out_of_memory_is_its_line_and_nothing_after_it',
    'test_multiprocess.py::test_two_processes_match_one_and_resume_its_checkpoint',
    'test_sweep.py::test_sigterm_to_the_sweep_is_forwarded_and_its_runs_save',
    'test_sweep.py::test_killed_sweep_reruns_only_the_unfinished_runs',
    'test_sweep_study.py::test_two_workers_on_postgres_finish_the_grid_once_after_a_kill_9',
    'test_benchmark.py::test_the_gpu_session_script_runs_its_steps_here',
    'test_bad_inputs.py::test_bad_input[full_disk_during_a_checkpoint]',
    # Standard streams closed at start, closed mid-run or pointed at a full device.
    'test_reliability_faults.py::test_a_closed_output_pipe_never_stops_the_run',
    'test_reliability_faults.py::test_a_closed_stdout_alone_never_stops_the_run',
    'test_reliability_faults.py::test_a_standard_stream_closed_at_start_never_stops_the_run',
    'test_reliability_faults.py::test_stdout_to_a_full_device_trains_saves_and_ends_with_one_line_naming_it',
    # Compiles for TPU slices and a GPU that are not here (also the fixtures tpu_reports and
    # gpu_report): every generation, every strategy, the fp8 GEMMs of XLA:GPU, the Pallas flash
    # attention kernel (`make test` still compiles plans for v3-8 through the documented commands).
    'test_compile_targets.py::test_every_generation_compiles_with_an_estimate',
    'test_compile_targets.py::test_every_strategy_compiles_for_a_v3_slice',
    'test_fp8.py::test_xla_gpu_makes_the_fp8_dots_cublaslt_fp8_gemms',
    'test_attention.py::test_flash_train_step_compiles_for_tpu_v3',
)


def _is_system(item) -> bool:
  # The id without its directory and without the `@group` that `--dist loadgroup` appends.
  name = item.nodeid.rsplit('/', 1)[-1].split('@', 1)[0]
  return (SYSTEM_FIXTURES & set(getattr(item, 'fixturenames', ())) or
          any(name == test or name.startswith(test + '[') for test in SYSTEM_TESTS))


def pytest_collection_modifyitems(items):
  for item in items:
    module = item.module.__name__.rsplit('.', 1)[-1]
    if module in SLOW_MODULES or SLOW_FIXTURES & set(getattr(item, 'fixturenames', ())):
      item.add_marker(pytest.mark.slow)
    if _is_system(item):
      item.add_marker(pytest.mark.system)


def pytest_configure(config):
  config.addinivalue_line(
      'markers', 'slow: starts subprocesses, trains end to end or compiles for a TPU slice '
      '(`make test` runs them, `make test-fast` leaves them out)')
  config.addinivalue_line(
      'markers', 'system: real services, several processes, signals and kills, full disks, '
      'memory limits (`make test-system` runs them, `make test` leaves them out; '
      'tests/conftest.py: SYSTEM_FIXTURES, SYSTEM_TESTS)')


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory):
  """A tfds data_dir shared by the whole test run (the embedded datasets mnist5k and digits need
  nothing in it: they are read from their arrays)."""
  return str(tmp_path_factory.mktemp('tfds'))


if os.environ.get('VIT_JAX_TEST_CPU_LOG'):
  import resource  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top

  def _cpu_seconds():
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime

  @pytest.hookimpl(hookwrapper=True)
  def pytest_runtest_protocol(item, nextitem):
    """Appends `<cpu seconds> <test id> <worker> <wall start> <wall end>` (CPU: this process and
    its finished subprocesses, set-up included) to $VIT_JAX_TEST_CPU_LOG: where the suite's CPU
    time goes, whatever the load, and when each worker was busy."""
    del nextitem
    start, wall = _cpu_seconds(), time.time()
    yield
    with open(os.environ['VIT_JAX_TEST_CPU_LOG'], 'a') as f:
      f.write(f'{_cpu_seconds() - start:.2f} {item.nodeid} '
              f'{os.environ.get("PYTEST_XDIST_WORKER", "main")} {wall:.1f} {time.time():.1f}\n')
