"""The native kernels' run-time choice a benchmark may set, to compare both sides of it in
separate runs: the lane kernels' codes for a one-pass K type."""

import argparse

from ember.backend import native


def add_kernel_choices(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lanes-x8",
        type=int,
        choices=[0, 1],
        default=1,
        help="the lane kernels (rows8.h, and vnni.h on the avx512 path) take a one-pass K "
        "type's x as q8_K's int8 codes (1, the default) or int16 ones (0)",
    )


def apply_kernel_choices(args: argparse.Namespace) -> None:
    native.set_lanes_x8(bool(args.lanes_x8))
