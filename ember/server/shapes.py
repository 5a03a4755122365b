"""What a runner process is loaded with (Shape), what a load uses for what a request leaves out
(Defaults), and the context a model loads with (bounded_ctx): the scheduler's matching rules,
apart from its bookkeeping."""

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class Shape:
    """The settings a runner process is loaded with; a request leaves out (None) what it does
    not set, and a loaded runner matches those: any num_thread, and a context of at least the
    one a load would give it (least_ctx). The scheduler sets num_batch to its default first."""

    model_path: str
    num_ctx: int | None = None
    num_batch: int | None = None
    num_thread: int | None = None
    projectors: tuple[str, ...] = ()  # mmproj files the model loads with (the model decides)
    draft: str = ""  # the GGUF of the draft model loaded beside it ("": none)

    def matches(self, loaded: "Shape", least_ctx: int = 0) -> bool:
        if self.model_path != loaded.model_path or self.draft != loaded.draft:
            return False
        # a larger context than the default serves as well (no reload); a smaller one, which
        # another request asked for, would cut this one's prompt (Ollama reloads for either)
        if self.num_ctx is None and (loaded.num_ctx or 0) < least_ctx:
            return False
        # a load cuts num_batch to num_ctx: a request asking for more wants what it got
        num_batch = self.num_batch
        if num_batch is not None and loaded.num_ctx is not None:
            num_batch = min(num_batch, self.num_ctx or loaded.num_ctx)
        return all(
            want is None or want == have
            for want, have in (
                (self.num_ctx, loaded.num_ctx),
                (num_batch, loaded.num_batch),
                (self.num_thread, loaded.num_thread),
            )
        )


MIN_CTX = 4  # as Ollama's scheduler: a smaller num_ctx loads 4


def bounded_ctx(num_ctx: int, context_length: int) -> int:
    """The num_ctx a model loads with: as Ollama's, never more than it was trained for (when
    its file says) nor less than MIN_CTX."""
    if context_length > 0:
        num_ctx = min(num_ctx, context_length)
    return max(num_ctx, MIN_CTX)


@dataclass(frozen=True, slots=True)
class Defaults:
    """What a load uses for what the request left out."""

    num_ctx: int = 4096
    num_batch: int = 512
    num_thread: int = 0
    kv_cache_type: str = ""
    multiuser_cache: bool = False

    def complete(self, shape: Shape, context_length: int) -> Shape:
        num_ctx = bounded_ctx(shape.num_ctx or self.num_ctx, context_length)
        num_batch = min(shape.num_batch or self.num_batch, num_ctx)  # as Ollama
        num_thread = self.num_thread if shape.num_thread is None else shape.num_thread
        return replace(shape, num_ctx=num_ctx, num_batch=num_batch, num_thread=num_thread)
