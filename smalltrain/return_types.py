"""Named result tuples like torch.return_types: `values, indices = x.max(1)` and `.values` / `.indices` both work."""
from collections import namedtuple

values_indices = namedtuple("values_indices", ["values", "indices"])
