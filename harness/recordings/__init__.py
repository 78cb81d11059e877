"""What the probe recorded of each release and how it is read back: `store` (a release's recording: contracts,
observations, the layout API; where recordings lie, loading and saving them, the contract table), `api_history`
and `allocations` (the layout API and the whole-model allocations release by release, standard library only: the
report reads them), `drift` (a live probe against its recording)."""
