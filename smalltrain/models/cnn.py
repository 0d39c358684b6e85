"""The 2-conv MNIST CNN: Conv2d(1,16,3)-ReLU-Conv2d(16,32,3)-ReLU-Flatten-Linear(18432,10)."""
from .. import nn


class MnistCnn(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.config = {"num_classes": num_classes}
        self.conv1 = nn.Conv2d(1, 16, 3)
        self.conv2 = nn.Conv2d(16, 32, 3)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(32 * 24 * 24, num_classes)

    def forward(self, x):
        x = self.relu(self.conv1(x))
        x = self.relu(self.conv2(x))
        return self.fc(self.flatten(x))
