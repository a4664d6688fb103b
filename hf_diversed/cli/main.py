"""``hf-diversed``: command-line entry point, one module per subcommand."""

from __future__ import annotations

import argparse
import platform
import shlex
import sys
from collections.abc import Sequence


def _env(args: argparse.Namespace) -> int:
    import torch
    import transformers

    import hf_diversed

    print(f"hf_diversed {hf_diversed.__version__}")
    print(f"python {platform.python_version()} on {platform.platform()}")
    print(f"torch {torch.__version__} (threads {torch.get_num_threads()}, cuda {torch.cuda.is_available()})")
    print(f"transformers {transformers.__version__}")
    for name in ("trl", "peft", "accelerate", "datasets", "huggingface_hub", "safetensors"):
        try:
            module = __import__(name)
            print(f"{name} {module.__version__}")
        except ImportError:
            print(f"{name} not installed")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from ..evaluation import demo
    from . import bench as bench_cli
    from . import demo as demo_cli
    from . import heads as heads_command
    from . import models as models_cli
    from . import trim_draft
    from . import tune as tune_cli

    parser = argparse.ArgumentParser(prog="hf-diversed", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("env", help="print versions").set_defaults(func=_env)
    models_cli.add_arguments(sub.add_parser("models", help="build the real models' GGUF copies (no Hub needed)"))
    heads = heads_command.add_arguments(sub.add_parser("heads", help="list the bundled heads; seed the HF cache"))
    heads.set_defaults(func=heads_command.run)
    demo_cli.add_arguments(sub.add_parser("demo", help="generate on the real pair, compare methods")).set_defaults(
        func=demo.run
    )
    bench_cli.add_arguments(sub.add_parser("bench", help="quality versus speed of decoding methods on real tasks"))
    sub.choices["bench"].set_defaults(func=bench_cli.run)
    trim = trim_draft.add_arguments(sub.add_parser("trim-draft", help="save a draft with a trimmed vocabulary"))
    trim.set_defaults(func=trim_draft.run)
    tune = tune_cli.add_arguments(sub.add_parser("tune", help="pick the fastest rule within a quality budget"))
    tune.set_defaults(func=tune_cli.run)
    return parser


def user_errors() -> tuple[type[Exception], ...]:
    """Errors a user's input or a missing resource raise: printed as one line (what and how to fix it), exit 2."""
    from ..evaluation.bench import BenchError
    from ..evaluation.real_models import RealModelError
    from ..evaluation.tasks import DataNotFoundError, TaskError

    return (BenchError, DataNotFoundError, RealModelError, TaskError)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.command_line = shlex.join(["hf-diversed", *argv])  # what the records and reports name as the command
    try:
        return int(args.func(args) or 0)
    except user_errors() as err:
        print(f"hf-diversed {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
