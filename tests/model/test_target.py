"""The target's explicit decoding mask: HF takes a 4D mask as is, so `Target.layer_masks` must hide
what the model's own mask hides, sliding windows included, or decoding past a window is no longer the
target's. And a target too large for the memory is refused before it loads."""

import pytest
import torch
import transformers

from blockdraft.model.target import Target
from tests.conftest import MORE_ARCHITECTURES, TINY_TARGET

WINDOW, LENGTH = 8, 30  # prompts longer than the window

SLIDING = {
    "gemma3": MORE_ARCHITECTURES["gemma3"],  # sliding layers named in layer_types (its window: 16)
    # no layer_types: with sliding_window set, every layer slides (Mistral-7B-v0.1, Phi-3-mini)
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "phi3": MORE_ARCHITECTURES["phi3"],
}


@pytest.mark.parametrize("name", SLIDING)
def test_the_explicit_mask_hides_what_the_models_own_mask_hides(name):
    config_class, model_class, settings = SLIDING[name]
    torch.manual_seed(0)
    cfg = getattr(transformers, config_class)(vocab_size=64, initializer_range=0.3,
                                              **{**TINY_TARGET, "sliding_window": WINDOW, **settings})
    model = getattr(transformers, model_class)(cfg).eval()
    target = Target(model, [0])
    ids = torch.randint(0, 64, (1, LENGTH))
    pos = torch.arange(LENGTH)[None]
    causal = torch.ones(LENGTH, LENGTH, dtype=torch.bool).tril()[None, None]  # [1, 1, Q, K]
    with torch.no_grad():
        own = model(ids).logits
        explicit = model(ids, attention_mask=target.layer_masks(causal, pos, pos)).logits
        unwindowed = model(ids, attention_mask=causal).logits
    assert not torch.allclose(own, unwindowed, atol=1e-4)  # the window matters at this length
    torch.testing.assert_close(explicit, own, atol=1e-5, rtol=1e-5)


def test_a_target_larger_than_the_free_memory_is_refused_in_one_line_before_loading(tiny_target, monkeypatch):
    """The kernel kills a process that runs the host out of memory with no message; the weights are
    counted from the config first and compared with what the device they are for has free."""
    from blockdraft import device as device_module
    from blockdraft.errors import UserError
    from blockdraft.model.target import load_target, weight_bytes

    config = transformers.AutoConfig.from_pretrained(tiny_target)
    need = weight_bytes(config, torch.float32)
    assert need == 4 * sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(config).parameters())
    monkeypatch.setattr(device_module, "free_memory_bytes", lambda device: need - 1)
    with pytest.raises(UserError, match=rf"^{tiny_target.name}'s weights in float32 take 0\.0 GB and this machine has "
                                        r"0\.0 GB free"):
        load_target(tiny_target, [1], torch.device("cpu"))
    monkeypatch.setattr(device_module, "free_memory_bytes", lambda device: need)
    assert load_target(tiny_target, [1], torch.device("cpu"))[0] is not None
