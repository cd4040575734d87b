"""The engines `blockdraft regenerate` writes answers with: Hugging Face `generate` (CPU or GPU,
batched, refilling finished rows) and vLLM where it is installed. Each takes rendered prompts and
returns (answer text, finished, answer tokens) per prompt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from blockdraft.errors import UserError, first_line

PAD_MULTIPLE = 64  # static cache: prompts padded to a multiple of this, so few shapes compile


class HFEngine:
    """Batched `generate` with left padding, on CPU or GPU, keeping `batch_size` rows busy.

    The static cache compiles decoding into CUDA graphs (the 10x on a launch-bound small target),
    which pays only if shapes repeat: one batch size (a short batch padded with copies of its last
    row), prompts padded to a multiple of PAD_MULTIPLE, one cache size per run. Answers come
    `chunk_tokens` at a time, so finished rows leave and queued prompts take their place instead of
    idling until the longest answer ends (the same greedy tokens, but for bf16 near-ties)."""

    def __init__(self, target: str, tokenizer: Any, device: str, cache: str, chunk_tokens: int):
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        from blockdraft.device import pick_device
        from blockdraft.model.target import require_room_for_weights, target_dtype

        self.torch = torch
        picked = pick_device(device)
        device, dtype = picked.type, target_dtype("auto", picked)
        try:
            require_room_for_weights(AutoConfig.from_pretrained(target), dtype, picked, Path(target).name)
            self.model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype).to(device).eval()
        except (OSError, ValueError) as exc:
            raise UserError(f"cannot load the target model from {target}: {first_line(exc)}") from None
        self.device = device
        self.tokenizer = tokenizer
        tokenizer.truncation_side = "left"  # a long chat keeps its latest turns
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        eos = self.model.generation_config.eos_token_id
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos:
            eos.append(tokenizer.eos_token_id)
        self.eos = eos
        self.static = cache == "static" or (cache == "auto" and device == "cuda")
        self.chunk_tokens = chunk_tokens

    def reseed(self, seed: int) -> None:
        self.torch.manual_seed(seed)

    def _chunk(self, rows: list[list[int]], new_tokens: int, batch_size: int, sampling: dict,
               cache_len: int) -> list[list[int]]:
        """One generate call: `new_tokens` more tokens for each row (ids so far), left-padded; a static
        cache of `cache_len` slots."""
        from transformers import GenerationConfig

        torch, n = self.torch, len(rows)
        width = max(map(len, rows))
        if self.static:
            rows = rows + [rows[-1]] * (batch_size - n)
            width = -(-width // PAD_MULTIPLE) * PAD_MULTIPLE
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, width - len(row) :] = torch.tensor(row)
            mask[i, width - len(row) :] = 1
        cache = {"cache_implementation": "static", "max_cache_len": cache_len} if self.static else {}
        config = GenerationConfig(max_new_tokens=new_tokens, pad_token_id=self.pad_id, eos_token_id=self.eos or None,
                                  **sampling, **cache)
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                      generation_config=config)
        return out[:n, width:].tolist()

    def generate(self, prompts: list[str], max_new_tokens: int, temperature: float, top_p: float, prompt_tokens: int,
                 batch_size: int) -> list[tuple[str, bool, int]]:
        """(answer text, finished, answer tokens) per prompt; finished is False where max_new_tokens cut it."""
        enc = self.tokenizer(prompts, add_special_tokens=False, truncation=True, max_length=prompt_tokens)["input_ids"]
        # --prompt-tokens (padded) + --max-new-tokens, whatever the batch: one compiled shape per run
        cache_len = -(-prompt_tokens // PAD_MULTIPLE) * PAD_MULTIPLE + max_new_tokens
        sampling = (
            {"do_sample": True, "temperature": temperature, "top_p": top_p} if temperature > 0 else {"do_sample": False}
        )
        chunk = min(self.chunk_tokens or max_new_tokens, max_new_tokens)
        answers: list[list[int]] = [[] for _ in prompts]
        finished = [False] * len(prompts)
        queue, active = list(range(len(prompts))), []
        while queue or active:
            take = batch_size - len(active)
            active, queue = active + queue[:take], queue[take:]
            new = self._chunk([enc[i] + answers[i] for i in active], chunk, batch_size, sampling, cache_len)
            still = []
            for i, ids in zip(active, new, strict=True):
                stop = next((k for k, t in enumerate(ids) if t in self.eos), None)
                room = max_new_tokens - len(answers[i])
                finished[i] = stop is not None and stop <= room
                answers[i] += ids[: min(room, len(ids) if stop is None else stop)]
                if not finished[i] and len(answers[i]) < max_new_tokens:
                    still.append(i)
            active = still
        return [(self.tokenizer.decode(a, skip_special_tokens=True), done, len(a))
                for a, done in zip(answers, finished, strict=True)]


class VLLMEngine:
    """vLLM, when installed; prompts go in as token ids so no second BOS is added."""

    def __init__(self, target: str, tokenizer: Any, seed: int):
        try:
            from vllm import LLM
        except ImportError:
            raise UserError("--engine vllm needs vLLM installed (pip install 'blockdraft[vllm]')") from None
        self.llm = LLM(model=target, seed=seed)
        self.tokenizer = tokenizer
        self.seed = seed

    def reseed(self, seed: int) -> None:
        self.seed = seed

    def generate(self, prompts: list[str], max_new_tokens: int, temperature: float, top_p: float, prompt_tokens: int,
                 batch_size: int) -> list[tuple[str, bool, int]]:
        from vllm import SamplingParams

        params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, seed=self.seed)
        token_prompts = [
            {"prompt_token_ids": self.tokenizer(p, add_special_tokens=False)["input_ids"][-prompt_tokens:]}
            for p in prompts
        ]
        outs = self.llm.generate(token_prompts, params, use_tqdm=False)
        return [(o.outputs[0].text, o.outputs[0].finish_reason == "stop", len(o.outputs[0].token_ids)) for o in outs]
