#!/usr/bin/env python3
"""Benchmark wdsprep's loader against the read limit, webdataset and kaldiio; see docs/bench.md.

Same as ``wdsprep bench``; ``python tools/bench.py --help`` for options.
"""

import sys

from wdsprep.bench import main

if __name__ == "__main__":
    sys.exit(main(prog="python tools/bench.py"))
