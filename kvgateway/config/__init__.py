"""The configuration, one concept a module:

- ``settings``: the settings types (``Settings``, ``SourceConfig``, ``StreamConfig``);
  ``cluster``: the cluster's (``NatsOptions``, ``Workers``);
- ``options``: the one option table, from which the flags, the ``KVGATEWAY_*`` variables, the
  TOML keys and the cluster's options are all made, and ``OptionSet``, what a command takes;
- ``coerce``: one value of an option checked; ``sources``, ``source_fields``, ``vllm``: a
  source in each form it is given, vLLM's ``--kv-events-config`` JSON among them;
- ``loading``: the file, the environment and the flags applied in order of precedence;
  ``validation`` and ``addresses``: the checks across settings;
- ``arguments``: the command line made from the table; ``summary``: the start-up line;
  ``errors``: ``ConfigError``, one line.

The settings types and the error are also here, the names the rest of the package knows it by.
"""

from kvgateway.config.errors import ConfigError
from kvgateway.config.settings import Settings, SourceConfig, StreamConfig

__all__ = ["ConfigError", "Settings", "SourceConfig", "StreamConfig"]
