"""``python -m placer``."""

from placer.cli import main

main()
