"""``python -m aiovec demo`` / ``python -m aiovec bench``."""

from .cli import main

main()
