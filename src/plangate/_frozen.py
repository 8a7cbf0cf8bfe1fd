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


class FrozenList(list[T]):
    """A list that refuses every change: a frozen model's list, as :class:`FrozenDict` is its mapping."""

    _refuse = FrozenDict._refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = append = clear = extend = insert = pop = remove = _refuse
    reverse = sort = _refuse

    def __reduce__(self) -> tuple[type[FrozenList[T]], tuple[list[T]]]:
        return type(self), (list(self),)


def frozen_json(value: Any) -> Any:
    """A JSON value whose objects and arrays, at any depth, refuse changes (its strings and numbers are immutable)."""
    if isinstance(value, dict):
        nested = {key: frozen_json(item) for key, item in value.items() if isinstance(item, dict | list)}
        return FrozenDict({**value, **nested} if nested else value)
    if isinstance(value, list):
        return FrozenList(frozen_json(item) if isinstance(item, dict | list) else item for item in value)
    return value


ReadOnly = Annotated[dict[K, V], AfterValidator(FrozenDict)]
"""A model field's mapping, frozen once validated (a frozen model's ``dict`` would still take edits in place)."""
ReadOnlyList = Annotated[list[T], AfterValidator(FrozenList)]
"""A model field's list, frozen once validated."""
ReadOnlyJSON = Annotated[dict[str, V], AfterValidator(frozen_json)]
"""A model field's mapping of JSON values, frozen all the way down once validated."""
