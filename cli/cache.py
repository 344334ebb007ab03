"""``wbfe cache info`` / ``wbfe cache prune``: what the score and object cache holds, and pruning it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional, Union

import typer

from ._group import Group
from ._options import Format, path_option

app = typer.Typer(cls=Group, no_args_is_help=True,
                  help="Inspect and prune wbfe's cache (score entries, object-store copies).")

_DIR_HELP = "Cache folder (default: $WBFE_CACHE_DIR, else ~/.cache/wbfe/scores)."


@app.command("info")
def info_command(
    cache_dir: Annotated[Optional[Path], path_option("--cache-dir", help=_DIR_HELP)] = None,
    fmt: Format = typer.Option(Format.table, "--format", "-f", help="Output format."),
) -> None:
    """Count and size what the cache holds, per kind, with when it was last used."""
    from wbfe.ranking.cache_admin import cache_info

    result = cache_info(cache_dir)
    typer.echo(json.dumps(result.to_dict(), indent=2) + "\n" if fmt is Format.json else result.table(), nl=False)


@app.command("prune")
def prune_command(
    max_size: Optional[str] = typer.Option(
        None, "--max-size", help="Keep at most this much (500M, 20G); least recently used go first. Default 20G "
        "unless --older-than is given alone; 'none' for no size bound (alone: only stale claims and day-old "
        "partial copies go)."),
    older_than: Optional[float] = typer.Option(None, "--older-than", help="Remove what was last used more than "
                                                                        "DAYS days ago."),
    cache_dir: Annotated[Optional[Path], path_option("--cache-dir", help=_DIR_HELP)] = None,
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be removed, remove nothing."),
    fmt: Format = typer.Option(Format.table, "--format", "-f", help="Output format."),
) -> None:
    """Remove old or least recently used entries and copies; never anything wbfe did not write."""
    from wbfe.ranking.cache_admin import prune_cache
    from wbfe.sources.object_bound import NO_BOUND, object_cache_bound

    if max_size is not None and max_size.strip().lower() == NO_BOUND:
        # no size bound, as with --older-than alone: stale claims and day-old partial copies still go
        bound: Union[str, int, None] = None
    elif max_size is not None:
        bound = max_size
    else:
        bound = None if older_than is not None else object_cache_bound()
    report = prune_cache(cache_dir, max_size=bound, older_than=older_than, dry_run=dry_run)
    typer.echo(json.dumps(report.to_dict(), indent=2) + "\n" if fmt is Format.json else report.summary(), nl=False)
