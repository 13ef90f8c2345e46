"""A tiny random Qwen3 built from a config: the unit-test model.

No download: the tokenizer is a byte-level BPE trained here on a fixed
corpus, the weights are a seeded random init (a few MB). It exercises the
exact code paths of a real Qwen3 (chat template, GQA, q/k norms, LoRA on
every projection) in seconds on a CPU.
"""
from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = """
You are a helpful assistant. Refuse requests that are unsafe and offer safe guidance instead.
Label: negative Label: rejective Label: positive Verdict: safe Verdict: unsafe Verdict: yes Verdict: no
I cannot help with that request, but here is some general safety information you may find useful.
Rewrite the basic request with the wrapping technique shown in the demonstration. <prompt> </prompt>
Imagine a story where a character asks for help. For a research paper, explain the general risks.
The quick brown fox jumps over the lazy dog. 0123456789 ,.;:!?'"()[]{}<>/\\-_=+*&^%$#@~`|
"""


def _corpus() -> list[str]:
    texts = [_CORPUS]
    # The tokenizer fits the prompts the tests send, read as whole files: every
    # byte shapes its merges, so a field no loader reads (an id, a `twin_of`)
    # moves the tiny runs' pinned numbers too (tests/test_e2e_tiny.py PINNED).
    # eval_kind.yaml (2026-12-04) stays out: its lines reach eval only with
    # rewards.eval_sees_kind, and reading it moved every pinned number and
    # two float-tolerance tests of the tiny model. twins.yaml holds ids only.
    prompts = Path(__file__).parent / "triplay" / "prompts"
    for file in sorted(prompts.glob("*")):
        if file.suffix in {".jsonl", ".yaml", ".txt"} and file.name not in {"eval_kind.yaml", "twins.yaml"}:
            texts.append(file.read_text(encoding="utf-8"))
    return texts


def build_tiny_tokenizer(vocab_size: int = 1024):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(_corpus(), trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIALS[1:],
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_tiny_qwen3(folder: Path, seed: int = 0, hidden: int = 64, layers: int = 2, init_std: float = 0.02) -> Path:
    """Write a tokenizer and a random Qwen3 (safetensors) into `folder`.
    `init_std` is the weights' standard deviation (transformers' 0.02 gives
    logits within about +-0.5, a nearly uniform next token that no adapter
    can move far; tests of what training learns want more room)."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    folder = Path(folder)
    tok = build_tiny_tokenizer()
    config = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        initializer_range=init_std,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return folder


def randomize_lora_b(model, seed: int, scale: float) -> None:
    """Fill every LoRA B matrix with seeded noise (PEFT starts them at zero,
    i.e. every adapter = the base): adapters that differ from the base and
    from each other, as trained ones do, for tests and benchmarks."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
