from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, Generic, NoReturn, Self, TypeVar, overload

from pydantic import AfterValidator, BaseModel, ConfigDict

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")


class cached(Generic[T]):  # noqa: N801 - used like the @property it stands beside
    """A property computed on first use and then kept in the instance.

    Like :func:`functools.cached_property` without its per-instance lock, which costs
    more than the small computations cached here; the values are pure functions of an
    immutable model, so computing one twice in a race is harmless.
    """

    def __init__(self, fn: Callable[[Any], T]) -> None:
        self.fn = fn
        self.name = fn.__name__
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> cached[T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> T | cached[T]:
        if obj is None:
            return self
        value = self.fn(obj)
        obj.__dict__[self.name] = value
        return value


class Frozen(BaseModel):
    """An immutable, strict pydantic model whose cached properties never go stale.

    ``model_copy(update=...)`` copies the instance dictionary, cached values included;
    a copy with changed fields must recompute them (a stale content hash would let an
    approval carry over to a plan it was not given for).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, ignored_types=(cached,))

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        copy = super().model_copy(update=update, deep=deep)
        for klass in type(copy).__mro__:
            for name, attr in vars(klass).items():
                if isinstance(attr, cached):
                    copy.__dict__.pop(name, None)
        return copy


class FrozenDict(dict[K, V]):
    """A dict that refuses every change: a frozen model's mapping, so nothing worked out from it goes stale.

    A ``dict`` still (pydantic serializes it, ``json.dumps`` writes it), and it pickles and copies as itself.
    """

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError(
            "this mapping is immutable: what its model worked out from it (a hash, remembered answers) would go "
            "stale; make a new model from changed data instead"
        )

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple[type[FrozenDict[K, V]], tuple[dict[K, V]]]:
        return type(self), (dict(self),)


ReadOnly = Annotated[dict[K, V], AfterValidator(FrozenDict)]
"""A model field's mapping, frozen once validated (a frozen model's ``dict`` would still take edits in place)."""
