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
    import marin_rules.eval.baseline  # noqa: F401  registers marin-unigram
    import marin_rules.eval.lm  # noqa: F401  registers marin
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
