"""`blockdraft bench --profile`: kernels sorted by kind and by the part of the update that launched them."""

import json

import pytest

from blockdraft.bench.profile import (
    UNRANGED,
    gaps_table,
    idle_gaps,
    kernel_kind,
    kernel_summary,
    summary_table,
    top_kernels,
    top_kernels_table,
)
from blockdraft.cli import main

# kernel names as the H200 profile of a Qwen3-8B-shaped update showed them (2026-12-02), and the
# loss's own Triton kernels (train/cross_entropy_kernel.py)
H200_NAMES = {
    "nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNN": "GEMM",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1": "SDPA attention",
    "triton_tem_fused_flex_attention_backward_transpose_view_6": "flex attention",
    "triton_tem_fused_flex_attention_15": "flex attention",
    "triton_per_fused_flex_attention_backward_transpose_view_5": "fused elementwise",
    "triton_red_fused__log_softmax__to_copy_argmax_exp_prepare_softmax_online_sub_0": "fused elementwise",
    "triton_per_fused__scaled_dot_product_cudnn_attention__to_copy__unsafe_view_add_cat_mean_mul": "fused elementwise",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::": "foreach (norm, optimizer)",
    "cross_entropy_row_stats": "cross-entropy (Triton)",
    "cross_entropy_softmax_minus_onehot": "cross-entropy (Triton)",
    "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native:": "other",
}


def test_kernel_kinds_from_the_names_a_gpu_profile_shows():
    assert {name: kernel_kind(name) for name in H200_NAMES} == H200_NAMES


def test_the_loss_kernels_are_filed_apart_from_inductors_kernels():
    """A profile names a Triton kernel after its Python function."""
    kernels = pytest.importorskip("blockdraft.train.cross_entropy_kernel")
    names = (kernels.cross_entropy_row_stats.__name__, kernels.cross_entropy_softmax_minus_onehot.__name__)
    assert {kernel_kind(name) for name in names} == {"cross-entropy (Triton)"}


def kernel(name, ts, dur):
    return {"cat": "kernel", "name": name, "ts": ts, "dur": dur}


def gpu_range(name, ts, dur):
    return {"cat": "gpu_user_annotation", "name": name, "ts": ts, "dur": dur}


def test_summary_attributes_each_kernel_to_the_range_it_started_in_per_update():
    trace = {"traceEvents": [
        gpu_range("target", 0, 1000), gpu_range("loss", 2000, 600),
        kernel("nvjet_sm90_a", 0, 800), kernel("triton_poi_fused_add_0", 850, 100),  # target
        kernel("nvjet_sm90_b", 2000, 400), kernel("triton_red_fused_softmax_1", 2450, 100),  # loss
        kernel("triton_tem_fused_flex_attention_backward_2", 3000, 600),  # launched by autograd's thread
        {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5000},  # not a kernel: not counted
    ]}
    s = kernel_summary(trace, updates=2)
    assert s["busy_ms"] == pytest.approx((800 + 100 + 400 + 100 + 600) / 1e3 / 2)
    assert s["idle_ms"] == pytest.approx((3600 - 2000) / 1e3 / 2)  # first kernel to the last one's end, less busy
    assert s["by_kind"] == pytest.approx({"GEMM": 0.6, "flex attention": 0.3, "fused elementwise": 0.1})
    assert list(s["by_range"]) == ["target", UNRANGED, "loss"]  # the most time first
    assert s["by_range"]["target"] == pytest.approx({"GEMM": 0.4, "fused elementwise": 0.05})
    assert s["by_range"]["loss"] == pytest.approx({"GEMM": 0.2, "fused elementwise": 0.05})
    assert s["by_range"][UNRANGED] == pytest.approx({"flex attention": 0.3})
    table = summary_table(s)
    assert "GPU busy 1.0, idle 0.8" in table and table.splitlines()[-1].split()[1:] == ["60.0%", "30.0%", "10.0%"]
    assert table.splitlines()[2].split() == ["target", "0.4", "0.0", "0.1", "0.5"]
    assert all(kind in table.splitlines()[1] for kind in s["by_kind"])  # each name whole ("fused elementwise")


def test_top_kernels_are_summed_by_name_per_update_with_their_whole_names():
    cast = "triton_per_fused__scaled_mm__to_copy__unsafe_view_abs_amax_clamp_reciprocal_mul_0"  # > 55 characters
    trace = {"traceEvents": [
        kernel(cast, 0, 3000), kernel(cast, 5000, 3000), kernel("sm90_xmma_gemm_e4m3", 3000, 4000),
        kernel("tiny", 9000, 10), {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 9000},
        {"cat": "kernel", "name": "no duration", "ts": 0},
    ]}
    top = top_kernels(trace, updates=2, top=2)
    assert [k["kernel"] for k in top] == [cast, "sm90_xmma_gemm_e4m3"]
    assert top[0] == {"kernel": cast, "kind": "fused elementwise", "ms": 3.0, "launches": 1.0}
    assert top[1] == {"kernel": "sm90_xmma_gemm_e4m3", "kind": "GEMM", "ms": 2.0, "launches": 0.5}
    lines = top_kernels_table(top, 2).splitlines()
    assert len(lines) == 3 and lines[1].split() == ["3.00", "1.0", "fused", "elementwise", cast]


def launched(name, ts, dur, correlation, tid=1):
    """A kernel and the host call that enqueued it."""
    return [{"cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"correlation": correlation}},
            {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts - 5, "dur": 3, "tid": tid,
             "args": {"correlation": correlation}}]


def host(cat, name, ts, dur, tid=1):
    return {"cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid}


def test_idle_gaps_are_put_down_to_the_host_op_that_launched_the_work_ending_them():
    trace = {"traceEvents": [
        *launched("nvjet_a", 100, 500, 1),
        *launched("triton_b", 300, 100, 2),  # inside a's span: no gap after b
        *launched("nvjet_c", 1600, 200, 3),  # 1000 us after a ends: launched inside the optimizer's fused step
        *launched("triton_d", 1805, 50, 4),  # 5 us: launch latency, not counted
        *launched("nvjet_e", 2055, 100, 5),  # 200 us, launched by aten::mm under no range
        host("user_annotation", "optimizer", 1000, 700),
        host("cpu_op", "Optimizer.step#AdamW.step", 1010, 680),
        host("cpu_op", "aten::_fused_adamw_", 1500, 150),  # the innermost op covering c's launch at 1595
        host("cpu_op", "aten::mm", 2000, 60),
        host("cpu_op", "aten::mm", 1590, 100, tid=2),  # another thread: not c's launcher
    ]}
    g = idle_gaps(trace, updates=2)
    assert g["idle_ms"] == pytest.approx((1000 + 200) / 1e3 / 2)
    assert g["by_cause"] == [{"range": "optimizer", "op": "aten::_fused_adamw_", "ms": pytest.approx(0.5)},
                             {"range": UNRANGED, "op": "aten::mm", "ms": pytest.approx(0.1)}]
    first, second = g["longest"]
    assert (first["ms"], first["before"], first["after"]) == (pytest.approx(1.0), "triton_b", "nvjet_c")
    assert second["ms"] == pytest.approx(0.2) and second["after"] == "nvjet_e"
    table = gaps_table(g)
    assert ": 0.6 ms," in table.splitlines()[0] and "aten::_fused_adamw_" in table.splitlines()[2]


def test_bench_profile_on_the_cpu_writes_the_op_table_and_trace(tmp_path, capsys):
    """The ranges the hot path opens reach the profiler (the kernel summary itself needs a GPU)."""
    rc = main(["bench", "--target-shape", "tiny", "--lengths", "full", "--steps", "1", "--warmup", "0", "--seq-len",
               "64", "--micro-batch", "1", "--device", "cpu", "--json", "--no-check", "--profile", str(tmp_path),
               "train.num_anchors=4"])
    assert rc == 0
    assert (tmp_path / "full-ops.txt").exists() and not (tmp_path / "full-kernels.txt").exists()
    names = {e.get("name") for e in json.loads((tmp_path / "full-trace.json").read_text())["traceEvents"]}
    assert {"target", "mask", "drafter", "loss", "clip", "Optimizer.step#AdamW.step"} <= names  # whole updates
