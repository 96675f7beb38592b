"""Checks of a layout on real (or emulated) hardware."""
