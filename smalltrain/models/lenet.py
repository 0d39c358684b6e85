"""LeNet-5 for 28x28 MNIST: Conv2d(1,6,5), MaxPool2d(2), Conv2d(6,16,5), MaxPool2d(2), Linear 256-120-84-10."""
from .. import nn
from ..nn import functional as F
from ..nn.fusion import chain_act, layer_act_pool


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
        # layer_act_pool is pool(act(layer(x))), chain_act the three linear layers with their activations on
        # x.flatten(1): fused ops on CUDA (nn/fusion.py), each backward writing the previous layer's g
        act = self.config["activation"]
        x = layer_act_pool(self.conv1, x, act, self.pool1)
        x = layer_act_pool(self.conv2, x, act, self.pool2)
        return chain_act(x, [(self.fc1, act), (self.fc2, act), (self.fc3, None)], flatten=True)

    def extra_repr(self):
        return f"activation={self.config['activation']!r}"
