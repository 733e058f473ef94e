"""The site keys: config keys that decide where a run executes, and their values kept out of whatever is written.

A leaf module (it imports no other herdrl module), so that configs, checkpoints, the logger and the trackers all
take the one definition without importing each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Config keys that decide where a run executes, what it installs or runs at start-up, and which cluster it
#: joins. They come from the user's command (flags, environment), never from a file: checkpoints write them
#: blank and :func:`herdrl.checkpoint.checkpoint_config` drops them. ``runtime_env`` can run shell commands
#: (``py_executable``), install packages (``pip``, ``uv``, ``conda``), set ``env_vars`` (credentials, such as
#: ``WANDB_API_KEY``, for the workers) and run hooks; a foreign ``address`` would connect this driver to a cluster
#: whose replies Ray unpickles; the dashboard serves Ray's job-submission API. Their values are masked wherever a
#: config is written or shown (:func:`mask_site_values`).
SITE_KEYS = ("address", "node_ip_address", "runtime_env", "include_dashboard")
#: What a site key's value reads as in results, trackers and on the console.
MASKED = "***"


def mask_site_values(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` (a config's dict form, or a trial's ``params``) fit to write or show: each site key's
    (:data:`SITE_KEYS`) values read :data:`MASKED`, its names kept (``runtime_env.env_vars.WANDB_API_KEY``); None
    and booleans stay, as they hold no secret. Other keys are the same objects as in ``config``."""
    def mask(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {key: mask(inner) for key, inner in value.items()}
        return value if value is None or isinstance(value, bool) else MASKED

    return {key: mask(value) if key in SITE_KEYS else value for key, value in config.items()}
