"""`distbench allreduce`: placeholder, being written (issue 10)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """allreduce's options."""


def command(args: argparse.Namespace) -> int:
    raise NotImplementedError
