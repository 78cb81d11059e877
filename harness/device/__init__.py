"""Where and how long the checks run: `devices` (a GPU per worker, Triton's setup, poisoned devices), `compiles`
(compile counting and the warm-up), `limits` (the per-item time limit, standard library only: the plugin imports it
at its top), `costs` (where an item's time goes)."""
