"""`lm_eval` with the `marin` and `marin-unigram` models registered.

lm-eval 0.4.13 looks model names up in a registry filled by imports, and has no
plugin entry points, so plain `lm_eval --model marin` cannot know our class. This
module imports it, then hands the command line to lm-eval's own CLI unchanged:

    python -m marin_rules.eval.cli --model marin --model_args checkpoint=PATH \\
        --tasks marin_shakespeare_bpb --include_path DIR
    python -m marin_rules.eval.cli --model marin-unigram \\
        --model_args tokenizer=TOKENIZER_JSON,corpus=DOWNLOAD_ARTIFACT --tasks ... --include_path DIR

Build DIR with `python -m marin_rules.eval.tasks <download artifact> DIR`.
"""

from __future__ import annotations


def main() -> None:
    """lm-eval's CLI; a bad `model_args` value of ours or an unreadable artifact is one
    line on stderr (exit status 2), not a traceback."""
    import sys

    import marin_rules.eval.baseline  # noqa: F401  registers marin-unigram
    from marin_rules.artifacts.errors import MarinError
    from marin_rules.eval.lm import ModelArgError  # registers marin
    from lm_eval.__main__ import cli_evaluate

    try:
        cli_evaluate()
    except (ModelArgError, MarinError) as e:
        print(f"marin-lm-eval: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
