"""Stream: the steps of one generation as an iterator, through dllm's step callback."""
import dataclasses
import queue
import threading

from . import _types as T


@dataclasses.dataclass(frozen=True)
class Step:
    """dllm_step_info after one denoising step, its arrays copied: `committed` holds the canvas positions this
    step unmasked, `canvas` the whole canvas (prompt ++ generation, masks as the mask id)."""
    block: int
    n_blocks: int
    step: int
    steps_per_block: int
    global_step: int
    total_steps: int
    n_masked: int
    prompt_len: int
    committed: list
    canvas: list

    @property
    def generated(self):
        """The canvas after the prompt."""
        return self.canvas[self.prompt_len:]

    @classmethod
    def from_c(cls, info):
        return cls(info.block, info.n_blocks, info.step, info.steps_per_block, info.global_step, info.total_steps,
                   info.n_masked, info.prompt_len, info.committed_pos[:info.n_committed], info.canvas[:info.canvas_len])


class _End:
    """The worker's last message: the Generation, or the exception dllm_generate raised."""

    def __init__(self, generation=None, error=None):
        self.generation, self.error = generation, error


class _Channel:
    """What the worker thread shares with the consumer. The worker holds no reference to the Stream itself, so a
    stream dropped mid-way (a `for` loop's break) is garbage collected, and its __del__ cancels the run."""

    def __init__(self):
        self.messages = queue.Queue()          # Steps, then one _End
        self.resume = threading.Semaphore(0)   # the consumer lets the library run the next step
        self.cancelled = False
        self.callback = T.STEP_FN(self.on_step)  # referenced here so that ctypes keeps the thunk alive

    def on_step(self, info_ptr, _user_data):
        if self.cancelled:
            return 1
        self.messages.put(Step.from_c(info_ptr.contents))
        self.resume.acquire()
        return 1 if self.cancelled else 0


def _worker(ctx, handle, channel, prompt, gp):
    try:
        generation, error = ctx._run_generate(handle, prompt, gp), None
    except BaseException as exc:  # handed to the consumer, raised there
        generation, error = None, exc
    finally:
        ctx._busy.release()
    channel.messages.put(_End(generation, error))


class Stream:
    """Iterates over Steps while the generation runs in a worker thread in lock step: the library waits in its
    step callback until the next step is asked for. Stopping early (break then close(), leaving a `with`
    block, or dropping the stream) cancels the generation at that step, and close() waits for it to end.
    `result` is the Generation once the stream is exhausted or closed (status ERR_CANCELLED if stopped)."""

    result = None
    _thread = None  # None until the generation started (the context may be busy)

    def __init__(self, ctx, prompt, gp):
        self._channel = _Channel()
        self._handed_out = False  # a Step is out: the library waits for resume before the next one
        gp.on_step = self._channel.callback
        handle = ctx._acquire()
        self._thread = threading.Thread(target=_worker, args=(ctx, handle, self._channel, prompt, gp), daemon=True)
        self._thread.start()

    def __iter__(self):
        return self

    def __next__(self):
        if self.result is not None:
            raise StopIteration
        if self._handed_out:
            self._handed_out = False
            self._channel.resume.release()
        message = self._channel.messages.get()
        if isinstance(message, _End):
            self._finish(message)
            raise StopIteration
        self._handed_out = True
        return message

    def _finish(self, end):
        self._thread.join()
        if end.error is not None:
            raise end.error
        self.result = end.generation

    def close(self):
        """Cancels the generation if it is still running and waits for the library to return."""
        if self._thread is None or self.result is not None:
            return
        if not self._thread.is_alive() and self._channel.messages.empty():
            return  # ended with an error, already raised by __next__
        self._channel.cancelled = True
        self._channel.resume.release()  # wakes a callback waiting for the consumer; it returns 1 (cancel)
        while True:
            message = self._channel.messages.get()
            if isinstance(message, _End):
                self._finish(message)
                return

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __del__(self):
        self.close()
