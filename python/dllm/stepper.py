"""Stepper: continuous batching (dllm_stepper). Prompts join a running batch at any step; every step tells each
sequence's commits and canvas."""
import dataclasses
from ctypes import POINTER, byref, c_int, c_int32, c_void_p, cast

from . import _types as T
from ._capi import DllmError, NativeHandle, check, id_array, lib, to_str
from .stream import Step


@dataclasses.dataclass(frozen=True)
class SeqEvent:
    """A sequence after the last step (dllm_seq_event): `step` its latest Step (the positions that step committed,
    the whole canvas so far), `stepped` whether the last step() ran it, and once `finished` its `result`: a Generation
    (status OK, or ERR_CANCELLED with the canvas so far) or the DllmError it failed with."""
    seq_id: int
    stepped: bool
    step: Step
    finished: bool
    result: object = None


class Stepper(NativeHandle):
    """A running batch on a context (dllm_stepper): add() a prompt at any time (it joins the next step), step()
    advances every live sequence by one step, poll() or events() tell what each one's last step did, remove() forgets
    a sequence once read. Each sequence gets exactly what Context.generate_batch gives it. One stepper a context
    (Context.generate may run between steps); closing the context closes it. max_fill_rows: the K/V-cache fills one
    step forwards, in canvas rows (None: the library's default, 1024; 0: no bound)."""

    _kind, _free_name = "stepper", "dllm_stepper_free"

    def __init__(self, ctx, max_sequences=16, max_fill_rows=None):
        params = lib().dllm_stepper_default_params()
        params.max_sequences = max_sequences
        if max_fill_rows is not None:
            params.max_fill_rows = max_fill_rows
        out = c_void_p()
        handle = ctx._acquire()
        try:
            check(lib().dllm_stepper_create(handle, params, byref(out)), handle)
        finally:
            ctx._busy.release()
        self.ctx = ctx
        self._outs = {}  # sequence id -> its output array, alive until the sequence is removed
        self._adopt(out.value)
        ctx._steppers.add(self)

    def _call(self, fn, *args):
        """fn(stepper, *args) with the context held, its failure raised with the context's message."""
        handle = self.ctx._acquire()
        try:
            return check(fn(self._handle(), *args), handle)
        finally:
            self.ctx._busy.release()

    def add(self, prompt, **params):
        """Adds a prompt (token ids or text, and generate()'s keyword arguments); returns its sequence id. A bad request
        raises DllmError, and so does a full stepper (status ERR_FULL: step, then add again)."""
        gp = self.ctx._gen_params(params)
        ids = id_array(self.ctx._prompt_ids(prompt))
        capacity = gp.gen_length + 1  # block diffusion may end with its AR seed
        out = (c_int32 * max(capacity, 1))()
        item = T.BatchItem(cast(ids, POINTER(c_int32)), len(ids), gp, out, capacity)
        seq_id = c_int(-1)
        self._call(lib().dllm_stepper_add, byref(item), byref(seq_id))
        self._outs[seq_id.value] = out
        return seq_id.value

    def step(self):
        """One step of every live sequence (the ones added since the last step join it)."""
        self._call(lib().dllm_stepper_step)

    @property
    def n_active(self):
        """Sequences not ended yet."""
        return lib().dllm_stepper_n_active(self._handle())

    def poll(self, seq_id):
        """The SeqEvent of a sequence."""
        raw = T.SeqEvent()
        self._call(lib().dllm_stepper_poll, seq_id, byref(raw))
        result = None
        if raw.finished:
            r = raw.result
            if r.status in (T.Status.OK, T.Status.ERR_CANCELLED):
                result = self.ctx._generation(self._outs[seq_id], r.n_out, r.stats, r.status)
            else:
                result = DllmError(r.status, to_str(r.error))
        return SeqEvent(seq_id, bool(raw.stepped), Step.from_c(raw.info), bool(raw.finished), result)

    def events(self):
        """The SeqEvents of every sequence held (added and not removed), in the order they were added."""
        return [self.poll(seq_id) for seq_id in self._outs]

    def cancel(self, seq_id):
        """Ends a sequence now (ERR_CANCELLED, its canvas so far); one that ended stays as it ended."""
        self._call(lib().dllm_stepper_cancel, seq_id)

    def remove(self, seq_id):
        """Forgets a sequence (cancelled first if it had not ended)."""
        self._call(lib().dllm_stepper_remove, seq_id)
        del self._outs[seq_id]

    def __repr__(self):
        return "<dllm.Stepper (closed)>" if self.closed else f"<dllm.Stepper {len(self._outs)} sequences on {self.ctx!r}>"
