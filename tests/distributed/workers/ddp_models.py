"""Small smalltrain.nn models the DDP workers train (imported after init_process_group, see ddp.py)."""
import smalltrain as st
from smalltrain import nn
from smalltrain.nn import functional as F


class SmallCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.fc = nn.Linear(4 * 6 * 6, 10)

    def forward(self, x):
        return self.fc(F.relu(self.conv(x)).flatten(1))


class Branchy(nn.Module):
    """A weight used twice, a layer never used, and a branch only rank 0 takes (data-dependent control flow)."""

    def __init__(self, use_branch):
        super().__init__()
        self.inp = nn.Linear(6, 8)
        self.shared = nn.Linear(8, 8)
        self.unused = nn.Linear(8, 8)
        self.branch = nn.Linear(8, 8)
        self.out = nn.Linear(8, 3)
        self.use_branch = use_branch

    def forward(self, x):
        h = F.relu(self.shared(F.relu(self.shared(self.inp(x)))))
        if self.use_branch:
            h = h + self.branch(h)
        return self.out(h)


class WithBuffer(nn.Module):
    def __init__(self, value):
        super().__init__()
        self.lin = nn.Linear(4, 2)
        self.register_buffer("scale", st.full((2,), float(value)))

    def forward(self, x):
        return self.lin(x) * self.scale
