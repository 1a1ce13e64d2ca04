"""python -m backends: print the manual's option tables (docs/commands.md holds them verbatim; a test keeps
them equal), the backends' sections as they are declared."""

import backends
from benchmarks import config

print(config.option_table(backends.NAMES))
print(config.allreduce_option_table(), end="")
