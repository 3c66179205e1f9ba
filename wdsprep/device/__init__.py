"""The trainer's side of the loader: torch modules that run on the batch's device, after the loader.

The loader's readers compute features on the CPU; with many GPUs per node and a fast model, that
CPU runs out first.  These modules take the work to the trainer's device instead, batched, with
the loader's own results: ``fbank`` (:class:`Fbank`, Kaldi fbank of padded waveforms, equal to the
``numpy`` backend) and ``specaugment`` (:class:`SpecAugmentModule`, the loader's SpecAugment),
each reading an utterance's draws by its key (``draws``: corpus seed, epoch, row).  Importing this
package imports torch; ``import wdsprep`` does not (its names resolve here on first use).
"""

from wdsprep.device.draws import KEY_FIELDS, draw_keys
from wdsprep.device.fbank import Fbank
from wdsprep.device.specaugment import SpecAugmentModule

__all__ = ["Fbank", "SpecAugmentModule", "draw_keys", "KEY_FIELDS"]
