"""``python -m kfp_gpu_rehearsal.devcluster build|up|down|status``."""

from __future__ import annotations

from .cli import main

raise SystemExit(main())
