"""pipeline.py's parts: from a corpus to a served chat model, one stage at a time.

    sizes.py    the stated defaults of each size (tiny, laptop, gpu)
    stages.py   each stage as our own commands, and the figures read from their logs
    runner.py   running a stage: its log, progress with an ETA, its done-marker, Ctrl-C
    report.py   report.md from the done-markers
"""
