"""The ``host`` backend: an emulated IPU on the CPU (the "IPU Model" role).

- :mod:`.session`: the Session: the compiled graph on ONNX Runtime, the step layout,
  weights in the device's dtype;
- :mod:`.trainer`: one training step (gradients per micro-batch, reduction, update);
- :mod:`.update_rules`: the ten optimizers' update rules, as Paddle's CPU kernels compute;
- :mod:`.gradients`: the gradient program built from the Paddle program a training
  model was compiled from;
- :mod:`.support`: the options it cannot honour.
"""

from paddle_ipu.backends.host.session import HostSession, available, create_session
from paddle_ipu.backends.host.support import SUPPORT

__all__ = ["SUPPORT", "HostSession", "available", "create_session"]
