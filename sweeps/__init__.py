"""Config sweeps over train.py: grids and Optuna searches, with seeds.

`sweep.py` is the command line; the modules here each do one job:

  spec.py       reads and checks the sweep's YAML file
  naming.py     turns binding values into Gin literals and short directory names
  validate.py   refuses bad bindings before any trial starts
  trial.py      one train.py run: its root_dir, whether it finished, the subprocess
  log.py        the sweep's JSON-lines event log (which trial started/finished when)
  executor.py   runs trials on N workers and stops cleanly on Ctrl-C
  grid.py       a cartesian-product sweep
  search.py     an Optuna search whose study lives in a database
  results.py    mean +- std over seeds: CSV and markdown table
  curves.py     learning curves from event files: PNG plot and CSV
  hparams.py    TensorBoard HParams summaries
"""
