"""`python -m lora_triplay ...` (and `accelerate launch -m lora_triplay run ...`): the CLI."""
from .cli import main

main()
