"""Training under a budget: noisy gradient descent and DP-SGD, each step a release through the
gate, and a scikit-learn-style estimator on top."""
