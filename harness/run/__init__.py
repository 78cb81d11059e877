"""Running the checks, without pytest: a session (`session`: the subject, the releases asked for and their
contracts, `releases`), the items it checks (`targets`), the example loop that runs one check over examples of one
target (`loop`, handing each example to the check as a `trial.Trial`), the kept failing examples (`regressions`),
where result lines go (`sink`), what a run covers and leaves out (`coverage`) and the CUDA warm-up (`warmup`).
"""
