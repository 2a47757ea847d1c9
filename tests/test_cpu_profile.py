"""masa.report.cpu_profile: perf script's samples split by thread and kernel entry.

The input is text in the shape `perf script -F comm,pid,tid,ip,sym,dso` prints
(benchmarks/bench_cpu_profile.py runs it on a real run); the counts are checked
against what each sample says.
"""

from __future__ import annotations

from masa.report.cpu_profile import (
    PAGE_FAULT,
    kernel_entry,
    parse_perf_script,
    run_threads,
)

PERF_SCRIPT = """\
python 500/500
\tffffffff815e0a0a unmap_page_range ([kernel.kallsyms])
\tffffffff815e1111 __x64_sys_munmap ([kernel.kallsyms])
\tffffffff81000130 entry_SYSCALL_64_after_hwframe ([kernel.kallsyms])
\t           f82ad munmap (/usr/lib/x86_64-linux-gnu/libc.so.6)

python 500/500
\t          101921 _PyEval_EvalFrameDefault (/usr/lib/libpython3.11.so.1.0)
\t    7fc94245dc40 [unknown] ([unknown])

masa-worker-0 500/501
\tffffffff815e9e2d do_anonymous_page ([kernel.kallsyms])
\tffffffff821f3046 exc_page_fault ([kernel.kallsyms])
\tffffffff81000c82 asm_exc_page_fault ([kernel.kallsyms])
\t1af5f7 MlasConvOperation (/s/onnxruntime_pybind11_state.cpython-311-x86_64-linux-gnu.so)

masa-worker-1 500/502
\tffffffff815e2222 follow_page_pte ([kernel.kallsyms])
\tffffffff815e3333 __x64_sys_mlock ([kernel.kallsyms])

masa-worker-1 500/502
\t1af5f7 MlasConvOperation (/s/onnxruntime_pybind11_state.cpython-311-x86_64-linux-gnu.so)

masa-sampler 500/503
\t          1af5f7 read (/usr/lib/x86_64-linux-gnu/libc.so.6)

kworker/u8:2-wr 77/77
\tffffffff815e4444 worker_thread ([kernel.kallsyms])

swapper     0/0
\tffffffff821f2c2b pv_native_safe_halt ([kernel.kallsyms])
"""


def test_samples_are_parsed_with_their_threads_and_frames() -> None:
    samples = parse_perf_script(PERF_SCRIPT.splitlines())
    assert [(s.comm, s.pid, s.tid) for s in samples] == [
        ("python", 500, 500), ("python", 500, 500), ("masa-worker-0", 500, 501),
        ("masa-worker-1", 500, 502), ("masa-worker-1", 500, 502),
        ("masa-sampler", 500, 503), ("kworker/u8:2-wr", 77, 77), ("swapper", 0, 0)]
    assert samples[0].frames[0] == ("unmap_page_range", "[kernel.kallsyms]")
    assert samples[2].frames[-1] == ("MlasConvOperation",
                                     "onnxruntime_pybind11_state.cpython-311-x86_64-linux-gnu.so")


def test_a_kernel_sample_is_charged_to_its_system_call_or_fault() -> None:
    samples = parse_perf_script(PERF_SCRIPT.splitlines())
    assert kernel_entry(samples[0].frames) == "munmap"
    assert kernel_entry(samples[2].frames) == PAGE_FAULT
    assert kernel_entry(samples[3].frames) == "mlock"
    assert kernel_entry(samples[6].frames) == "worker_thread"  # no system call: its root


def test_the_run_splits_into_its_loop_workers_and_other_threads() -> None:
    groups = run_threads(parse_perf_script(PERF_SCRIPT.splitlines()))
    assert set(groups) == {"loop", "workers", "masa-sampler"}  # other processes left out
    loop, workers = groups["loop"], groups["workers"]
    assert (loop.samples, loop.kernel_samples) == (2, 1)
    assert loop.kernel_by_entry == {"munmap": 1}
    assert loop.user_by_object == {"libpython3.11.so.1.0": 1}
    assert (workers.samples, workers.kernel_samples) == (3, 2)
    assert workers.kernel_by_entry == {PAGE_FAULT: 1, "mlock": 1}
    assert workers.as_dict()["user_by_object"] == {
        "onnxruntime_pybind11_state.cpython-311-x86_64-linux-gnu.so": 1}


def test_no_worker_sampled_means_no_run() -> None:
    assert run_threads(parse_perf_script(["python 9/9", "\t1 f (/x.so)", ""])) == {}
