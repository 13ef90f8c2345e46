"""lora-triplay: tri-role self-play RL for LLM safety alignment on one base
model with three LoRA adapters (red, blue, eval)."""

__version__ = "0.2.0"
