"""Generation backends: llama.cpp for GGUF, transformers for HF folders (and GGUF, dequantised).

Both stream tokens to `on_text` and stop promptly when `cancel` is set. Heavy imports happen in the loaders.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import secrets
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from gpubox.errors import CapacityError, GpuboxError, InvalidInputError
from gpubox.extras import require
from gpubox.tools.inference import load_probe
from gpubox.tools.inference.context import context_error, room_for, trained_context
from gpubox.tools.inference.grammar import schema_to_gbnf
from gpubox.tools.inference.grammar_probe import check_in_child
from gpubox.tools.inference.hf_stream import cut_at_stop, generate_into, read_stream, timed_streamer
from gpubox.tools.inference.llama_import import llama_cpp
from gpubox.tools.inference.llama_stream import read_chunks

KV_TYPES = {"f16": 1, "q8_0": 8, "q4_0": 2}  # ggml type ids

T = TypeVar("T")


def _free_accelerator_memory() -> None:
    """Return cached CUDA blocks to the driver so the next fit plan (NVML free memory) sees them."""
    import gc

    gc.collect()
    # only torch's own cache: a process that never imported torch has none, and importing it here would put a
    # second set of CUDA libraries beside llama.cpp's (on an H200 box, torch 2.11+cu130 imported before a CUDA
    # build of llama-cpp-python crashed the process at its next model load)
    cuda = getattr(sys.modules.get("torch"), "cuda", None)  # None too while another thread is importing torch
    with contextlib.suppress(Exception):  # a cache left full is only memory NVML reports as used a while longer
        if cuda is not None and cuda.is_available():
            cuda.empty_cache()


@dataclass
class GenParams:
    max_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    repeat_penalty: float = 1.1
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    json_schema: dict[str, Any] | None = None
    fit: bool = False  # max_tokens is the tools' default, not the caller's: lowered to the room the prompt leaves


@dataclass
class GenOutput:
    text: str
    finish_reason: Literal["stop", "length", "cancelled"]
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float | None
    prefill_tps: float | None
    decode_tps: float | None
    total_s: float


class LlamaBackend:
    name: Literal["llama.cpp"] = "llama.cpp"

    def __init__(
        self,
        path: Path,
        n_ctx: int,
        n_gpu_layers: int,
        kv_cache_type: str,
        n_threads: int | None,
        lora_path: Path | None = None,
        probe: bool = True,
    ) -> None:
        require("llama_cpp", "llama", "The llama.cpp backend")
        if probe:  # a GPU build is loaded once in a child first: a crash there is an error, not the end of the server
            load_probe.check(path, n_ctx, n_gpu_layers, kv_cache_type, n_threads, lora_path)
        # Every call into this model runs on its own single thread. llama.cpp's CPU backend uses OpenMP, and
        # libgomp gives each calling thread its own worker team; once there are more team threads than cores it
        # stops spinning and decode drops by ~35% on a 2-core box (measured: 120 -> 75 tok/s). One caller
        # thread per model keeps one team, and a second model loading on its own thread never waits for this one.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"gpubox-llama-{path.stem[:24]}")
        try:
            self.llm = self._call(self._load, path, n_ctx, n_gpu_layers, kv_cache_type, n_threads, lora_path)
        except BaseException:
            self._thread.shutdown(wait=False)
            raise
        self.n_ctx = n_ctx
        self.n_ctx_train = trained_context(self.llm)
        self.path = path
        self.prompt_tokens = 0  # of the last generation: its whole prompt, a cached prefix included

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return self._thread.submit(fn, *args).result()

    @staticmethod
    def _load(
        path: Path, n_ctx: int, n_gpu_layers: int, kv_cache_type: str, n_threads: int | None, lora_path: Path | None
    ) -> Any:
        L = llama_cpp()
        kv = KV_TYPES[kv_cache_type]
        return L.Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_gpu_layers=n_gpu_layers,
            n_threads=n_threads,
            n_threads_batch=n_threads,
            type_k=kv,
            type_v=kv,
            flash_attn=kv_cache_type != "f16",  # llama.cpp needs flash attention for a quantised V cache
            # one GPU, the first visible: the load plan is fitted to its free memory and the box ledger reserves
            # it there (llama.cpp's default would spread layers over every visible GPU, unreserved)
            split_mode=L.LLAMA_SPLIT_MODE_NONE,
            main_gpu=0,
            lora_path=str(lora_path) if lora_path else None,
            verbose=False,
        )

    def _count(self, text: str) -> int:
        return len(self.llm.tokenize(text.encode(), add_bos=True, special=True))

    def count(self, text: str) -> int:
        return self._call(self._count, text)

    def generate(
        self,
        messages: list[dict[str, str]] | None,
        prompt: str | None,
        p: GenParams,
        on_text: Callable[[str], None],
        cancel: threading.Event,
    ) -> GenOutput:
        # the schema check and grammar conversion are pure Python: done here, before llama.cpp sees anything;
        # then llama.cpp parses the grammar once in a child process, so a parser crash cannot end this one
        grammar = schema_to_gbnf(p.json_schema) if p.json_schema is not None else None
        if grammar is not None:
            check_in_child(grammar, self.path)
        return self._call(self._generate, messages, prompt, p, on_text, cancel, grammar)

    def _generate(
        self,
        messages: list[dict[str, str]] | None,
        prompt: str | None,
        p: GenParams,
        on_text: Callable[[str], None],
        cancel: threading.Event,
        grammar: str | None,
    ) -> GenOutput:
        lc = llama_cpp()
        kwargs = _sampling(p)
        if grammar is not None:
            kwargs["grammar"] = lc.LlamaGrammar.from_string(grammar, verbose=False)
        lc.llama_perf_context_reset(self.llm.ctx)
        self.prompt_tokens = 0
        sampled = self._count_sampled(p)
        t0 = time.perf_counter()
        try:
            stream = (
                self.llm.create_chat_completion(messages=messages, **kwargs)  # type: ignore[arg-type]
                if messages is not None
                else self.llm.create_completion(prompt or "", **kwargs)
            )
            read = read_chunks(stream, on_text, cancel)  # type: ignore[arg-type]
        except ValueError as exc:
            m = re.search(r"Requested tokens \((\d+)\) exceed context window of (\d+)", str(exc))
            if m:
                raise context_error(int(m.group(1)), p.max_tokens, int(m.group(2)), n_max=self.n_ctx_train) from exc
            raise
        finally:
            vars(self.llm).pop("generate", None)  # the class's own again
        total = time.perf_counter() - t0
        perf = lc.llama_perf_context(self.llm.ctx)
        n_p, n_e = int(perf.n_p_eval), int(perf.n_eval)
        return GenOutput(
            text="".join(read.parts),
            finish_reason=read.finish,
            prompt_tokens=self.prompt_tokens or n_p,
            completion_tokens=sampled[0],
            ttft_s=(read.first - t0) if read.first else None,
            prefill_tps=n_p / (perf.t_p_eval_ms / 1000) if perf.t_p_eval_ms > 0 else None,
            decode_tps=n_e / (perf.t_eval_ms / 1000) if perf.t_eval_ms > 0 and n_e else None,
            total_s=total,
        )

    def _count_sampled(self, p: GenParams) -> list[int]:
        """Wrap this model's `generate` for one call (the caller pops it after): it checks the room for
        `p.max_tokens` and counts the sampled tokens into the list returned. Set on the instance for this call only,
        so no lasting cycle keeps a dropped model alive until a garbage collection."""
        lc = llama_cpp()
        generate, vocab = self.llm.generate, lc.llama_model_get_vocab(self.llm.model)
        sampled = [0]

        def counted(tokens: Any, *args: Any, **kwargs: Any) -> Any:
            # llama.cpp's perf counters count only the prompt tokens it evaluated, 1 when the prefix was cached;
            # every completion (chat template applied) passes its whole prompt here
            self.prompt_tokens = len(tokens)
            # the room check for both tools, on the tokens llama.cpp evaluates (for a chat, its template applied):
            # llama-cpp-python would quietly lower a max_tokens that does not fit; a `fit` one it lowers as asked
            room_for(len(tokens), p.max_tokens, p.fit, self.n_ctx, self.n_ctx_train)
            # the answer's tokens as llama-cpp-python counts them (not an end-of-generation one); its perf counter
            for token in generate(tokens, *args, **kwargs):  # misses the last, never fed back: 7 for 8
                sampled[0] += not lc.llama_vocab_is_eog(vocab, token)
                yield token

        self.llm.generate = counted
        return sampled

    def close(self) -> None:
        try:
            self._call(self.llm.close)
        finally:
            self._thread.shutdown(wait=False)
        _free_accelerator_memory()


def _sampling(p: GenParams) -> dict[str, Any]:
    """llama-cpp-python's completion arguments for `p`, streamed."""
    return {
        "max_tokens": p.max_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "top_k": p.top_k,
        "repeat_penalty": p.repeat_penalty,
        "stop": p.stop or None,
        # unseeded: a fresh seed, not llama-cpp-python's next one derived from the last (the same sequence after
        # every restart, and one client's seed deciding the next client's sampling)
        "seed": p.seed if p.seed is not None else secrets.randbits(31),
        "stream": True,
    }


class TransformersBackend:
    name: Literal["transformers"] = "transformers"

    def __init__(self, path: Path, quantization: str | None, adapter: Path | None, n_ctx: int) -> None:
        require("transformers", "hf", "The transformers backend")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        kwargs: dict[str, Any] = {"dtype": torch.bfloat16 if self.device == "cuda" else torch.float32}
        if path.suffix == ".gguf":
            if quantization:
                raise InvalidInputError("4/8-bit quantisation needs an HF folder, not a GGUF file (transformers limit)")
            from transformers import GgufConfig

            src, kwargs["gguf_file"] = str(path.parent), path.name
            # dequantise: a GGUF-quantised model cannot be trained or saved (transformers 5.x)
            kwargs["quantization_config"] = GgufConfig(dequantize=True)
            self.tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=path.name)
        else:
            src = str(path)
            self.tokenizer = AutoTokenizer.from_pretrained(src)
            if quantization:
                require("bitsandbytes", "train", "4/8-bit loading")
                from transformers import BitsAndBytesConfig

                kwargs["quantization_config"] = (
                    BitsAndBytesConfig(
                        load_in_4bit=True,
                        bnb_4bit_quant_type="nf4",
                        bnb_4bit_use_double_quant=True,
                        bnb_4bit_compute_dtype=kwargs["dtype"],
                    )
                    if quantization == "4bit"
                    else BitsAndBytesConfig(load_in_8bit=True)
                )
        if self.device == "cuda":
            # all on the GPU the box ledger reserved (cuda:0): "auto" would spread it over every visible GPU and
            # spill to host RAM, memory nobody reserved; one that does not fit is an out-of-memory error instead
            kwargs["device_map"] = {"": 0}
        model = AutoModelForCausalLM.from_pretrained(src, **kwargs)
        if adapter is not None:
            require("peft", "train", "LoRA adapters")
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(adapter))
        model.eval()
        self.model: Any = model
        self.n_ctx = n_ctx
        self.n_ctx_train: int | None = model.config.to_dict().get("max_position_embeddings")  # as infer_load caps it

    def count(self, text: str) -> int:
        return len(self.tokenizer(text)["input_ids"])

    def generate(
        self,
        messages: list[dict[str, str]] | None,
        prompt: str | None,
        p: GenParams,
        on_text: Callable[[str], None],
        cancel: threading.Event,
    ) -> GenOutput:
        import torch

        if p.json_schema is not None:
            raise InvalidInputError("json_schema output needs the llama.cpp backend (load a GGUF model)")
        inputs = self.inputs(messages, prompt).to(self.model.device)
        n_prompt = int(inputs["input_ids"].shape[1])
        p = dataclasses.replace(p, max_tokens=room_for(n_prompt, p.max_tokens, p.fit, self.n_ctx, self.n_ctx_train))
        if p.seed is not None:
            torch.manual_seed(p.seed)
        streamer = timed_streamer(self.tokenizer)
        gen_kwargs = {**inputs, **self._generate_kwargs(p, streamer, cancel)}
        out: dict[str, Any] = {}
        t0 = time.perf_counter()
        worker = threading.Thread(
            target=generate_into, args=(self.model, gen_kwargs, streamer, out), name="gpubox-hf-generate", daemon=True
        )
        worker.start()
        parts, first_text = read_stream(streamer, worker, cancel, on_text)
        worker.join()
        first = streamer.first_token or first_text
        if "err" in out:
            raise _generate_error(out["err"])
        total = time.perf_counter() - t0
        n_new = int(out["ids"].shape[1]) - n_prompt if "ids" in out else 0
        text_out = "".join(parts)
        finish = "cancelled" if cancel.is_set() else ("length" if n_new >= p.max_tokens else "stop")
        if finish == "stop":
            text_out = cut_at_stop(text_out, p.stop)
        decode_s = total - ((first - t0) if first else 0)
        return GenOutput(
            text=text_out,
            finish_reason=finish,
            prompt_tokens=n_prompt,
            completion_tokens=n_new,
            ttft_s=(first - t0) if first else None,
            prefill_tps=n_prompt / (first - t0) if first else None,
            decode_tps=(n_new - 1) / decode_s if n_new > 1 and decode_s > 0 else None,
            total_s=total,
        )

    def inputs(self, messages: list[dict[str, str]] | None, prompt: str | None) -> Any:
        """The token ids the model reads. A chat template writes its own BOS where it wants one, so the rendered
        chat is tokenized without special tokens (a Llama-style tokenizer added a second BOS in front: the
        model read a malformed prompt and the context check counted one token too many)."""
        text = self._prompt_text(messages, prompt)
        return self.tokenizer(text, return_tensors="pt", add_special_tokens=messages is None)

    def _prompt_text(self, messages: list[dict[str, str]] | None, prompt: str | None) -> str:
        """The text to tokenize: chat messages through the model's chat template, else the raw prompt."""
        if messages is None:
            return prompt or ""
        if not self.tokenizer.chat_template:
            raise InvalidInputError("this model has no chat template; use infer_complete with a raw prompt")
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _generate_kwargs(self, p: GenParams, streamer: Any, cancel: threading.Event) -> dict[str, Any]:
        """model.generate's arguments besides the inputs: sampling as `p` asks, streaming, and a stop on `cancel`."""
        from transformers import StoppingCriteria, StoppingCriteriaList

        class Cancelled(StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:  # type: ignore[override]
                return cancel.is_set()

        kwargs: dict[str, Any] = {
            "max_new_tokens": p.max_tokens,
            "streamer": streamer,
            "do_sample": p.temperature > 0,
            "repetition_penalty": p.repeat_penalty,
            "stopping_criteria": StoppingCriteriaList([Cancelled()]),
            "pad_token_id": self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
        }
        if p.temperature > 0:
            kwargs.update(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k)
        if p.stop:
            kwargs.update(stop_strings=p.stop, tokenizer=self.tokenizer)
        return kwargs

    def close(self) -> None:
        self.model = None
        _free_accelerator_memory()


def _generate_error(exc: BaseException) -> Exception:
    """The generate thread's exception as an error the caller can act on (out of memory named as such)."""
    name = type(exc).__name__
    if isinstance(exc, MemoryError) or "OutOfMemory" in name or "out of memory" in str(exc).lower():
        _free_accelerator_memory()
        return CapacityError(
            f"out of memory while generating ({name}: {exc}); lower max_tokens, reload with a smaller "
            "context_length or 4bit quantization, or unload other models"
        )
    if isinstance(exc, GpuboxError):
        return exc
    return GpuboxError(f"transformers generation failed: {name}: {exc}")
