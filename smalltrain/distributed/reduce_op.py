"""`ReduceOp`: how a collective combines the ranks' values (torch.distributed.ReduceOp's names)."""
import enum


class ReduceOp(enum.Enum):
    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"

    def __repr__(self):
        return f"ReduceOp.{self.name}"
