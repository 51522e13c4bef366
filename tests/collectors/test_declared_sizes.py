"""attach() takes the sizes of the model a small one stands in for (the demo's tiny DeepSeek-V3 declares
DeepSeek-V3's), winning over the configs', and the GPU profile the cost model prices."""
from moe_monitor.collectors import attach
from moe_monitor.core.costmodel import ModelDims
from tests.support.tiny_models import build


def test_declared_sizes_win_over_the_configs():
    plain = attach(build("qwen3_moe"), nvml=False)
    assert plain.meta.hidden_size < 7168 and plain.meta.gpu_profile == ""
    plain.close()
    monitor = attach(build("qwen3_moe"), nvml=False, gpu_profile="H100 SXM", hidden_size=7168,
                     moe_intermediate_size=2048, expert_matrices=3, dtype_bytes=1, act_dtype_bytes=2)
    meta = monitor.meta
    assert (meta.hidden_size, meta.moe_intermediate_size, meta.dtype_bytes, meta.act_dtype_bytes) == (7168, 2048, 1, 2)
    assert meta.gpu_profile == "H100 SXM" and meta.model_name == plain.meta.model_name
    assert ModelDims.from_meta(meta) == ModelDims(7168, 2048, 3, 1.0, 2.0)
    monitor.close()
