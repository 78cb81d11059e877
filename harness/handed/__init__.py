"""What a subject is handed: the layer value with a layer's kv_cache (`layer`), a cache written in a contract's
geometry through a page table (`cache`), and a whole model's caches as a release allocates them (`model`)."""
