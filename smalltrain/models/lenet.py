"""LeNet-5 for 28x28 MNIST: Conv2d(1,6,5), MaxPool2d(2), Conv2d(6,16,5), MaxPool2d(2), Linear 256-120-84-10."""
from .. import nn
from ..nn import functional as F


class LeNet5(nn.Module):
    """Each conv is followed by the activation, then 2x2 max pooling; the first two linear layers too."""

    def __init__(self, activation="gelu", num_classes=10):
        super().__init__()
        if activation not in ("gelu", "relu"):
            raise ValueError(f"LeNet5: activation must be 'gelu' or 'relu', got {activation!r}")
        self.config = {"activation": activation, "num_classes": num_classes}
        self.act = F.gelu if activation == "gelu" else F.relu
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.pool2 = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(16 * 4 * 4, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x):
        x = self.pool1(self.act(self.conv1(x)))
        x = self.pool2(self.act(self.conv2(x)))
        x = x.flatten(1)
        x = self.act(self.fc1(x))
        x = self.act(self.fc2(x))
        return self.fc3(x)

    def extra_repr(self):
        return f"activation={self.config['activation']!r}"
