# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
# cython: embedsignature=True, binding=True, auto_pickle=False
# distutils: extra_compile_args = -O2
"""A frozen slotted dataclass's ``__init__``, writing the slots from C.

The values a request carries through the router and the simulator (the request, the
decision, the response's feedback and queue vector, the cache's match and changes, the
record) are frozen dataclasses: immutable, hashable, with ``fields``, ``replace`` and a
readable repr. Their generated ``__init__`` sets each field through
``object.__setattr__`` (a frozen class refuses plain assignment), about 75 ns a field:
a 23-field record took 1.7 µs to build, a plain slotted dataclass 0.3 µs, and together
they cost a simulated request about 7 % (paired runs). :func:`frozen_init` keeps
everything the dataclass is and replaces only ``__init__``: one generated with the same
signature (defaults included) that hands the values to a compiled writer, which stores
each in its slot as a member descriptor would, then calls ``__post_init__`` if the
class has one. The signatures are in ``frozen_init.pyi``.

Values a component builds valid by construction (a table's patch, a writer's batch, a
publisher's columns) skip ``__init__`` and its checks altogether: :class:`SlotBuilder`
makes the instance and writes its slots in one compiled call, where
``object.__setattr__`` per slot cost a patch batch or an event batch about 0.6 µs.
"""

import dataclasses
import inspect
import types

from cpython.object cimport PyTypeObject
from cpython.ref cimport Py_INCREF, Py_XDECREF, PyObject
from libc.stdlib cimport free, malloc

__all__ = ["SlotBuilder", "field_builder", "frozen_init"]


cdef extern from "Python.h":
    # The offset a slot's member descriptor reads and writes (structmember.h).
    ctypedef struct PyMemberDef:
        Py_ssize_t offset
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member


cdef class _SlotWriter:
    """Stores a tuple of values in an instance's slots, in field order."""

    cdef object cls
    cdef Py_ssize_t n
    cdef Py_ssize_t* offsets

    def __cinit__(self, cls, tuple names):
        if not isinstance(cls, type):  # (a metaclass's instance too: `type cls` refuses one)
            raise TypeError(f"expected a class, got {type(cls).__name__}")
        self.cls = cls
        self.n = len(names)
        self.offsets = <Py_ssize_t*>malloc(max(self.n, 1) * sizeof(Py_ssize_t))
        if self.offsets is NULL:
            raise MemoryError()
        for i, name in enumerate(names):
            slot = cls.__dict__.get(name)
            if type(slot) is not types.MemberDescriptorType:
                raise TypeError(f"{cls.__name__}.{name} is not a slot of the class")
            self.offsets[i] = (<PyMemberDescrObject*>slot).d_member.offset

    def __dealloc__(self):
        free(self.offsets)

    def __call__(self, obj, tuple values):
        if not isinstance(obj, self.cls):
            raise TypeError(f"not a {self.cls.__name__}: {type(obj).__name__}")
        self.store(obj, values)

    cdef int store(self, object obj, tuple values) except -1:
        cdef Py_ssize_t i
        cdef PyObject** slot
        if len(values) != self.n:
            raise TypeError(f"{self.cls.__name__} takes {self.n} values, not {len(values)}")
        for i in range(self.n):
            value = values[i]
            slot = <PyObject**>(<char*><PyObject*>obj + self.offsets[i])
            Py_INCREF(value)
            Py_XDECREF(slot[0])
            slot[0] = <PyObject*>value
        return 0


cdef extern from "Python.h":
    # What a class statement's type allocates with, which object.__new__ calls for a class
    # that is not abstract and takes no arguments (the slotted dataclasses here).
    object PyType_GenericAlloc(PyTypeObject* cls, Py_ssize_t n_items)
    ctypedef struct _TypeAlloc "PyTypeObject":
        void* tp_alloc
        void* tp_new
        unsigned long tp_flags
    void* _GENERIC_ALLOC "((void*)PyType_GenericAlloc)"
    unsigned long _ABSTRACT "Py_TPFLAGS_IS_ABSTRACT"


cdef bint _allocates_plainly(object cls):
    """Whether ``object.__new__(cls)`` is ``PyType_GenericAlloc(cls, 0)``: the class
    neither defines ``__new__`` nor allocates its own way, and is not abstract."""
    cdef _TypeAlloc* t = <_TypeAlloc*>cls
    return (
        t.tp_new == (<_TypeAlloc*>object).tp_new
        and t.tp_alloc == _GENERIC_ALLOC
        and not t.tp_flags & _ABSTRACT
    )


cdef class SlotBuilder:
    """``SlotBuilder(cls, names)(*values)``: a new ``cls`` whose slots ``names`` hold
    ``values``, in order, built without ``cls.__init__`` (nor ``__post_init__``). For
    values their maker keeps valid: nothing is checked but their count. Every name must
    be a slot of ``cls`` itself (TypeError otherwise)."""

    cdef _SlotWriter writer
    cdef object cls

    def __init__(self, cls, tuple names):
        self.writer = _SlotWriter(cls, names)  # TypeError unless a class with those slots
        if not _allocates_plainly(cls):
            raise TypeError(f"{cls.__name__} is abstract or has its own __new__ or allocator")
        self.cls = cls

    def __call__(self, *values):
        # What object.__new__(cls) does, without the call: about 25 ns less a value.
        obj = PyType_GenericAlloc(<PyTypeObject*>self.cls, 0)
        self.writer.store(obj, values)
        return obj


def field_builder(cls):
    """The :class:`SlotBuilder` of a slotted dataclass's fields, in declaration order."""
    return SlotBuilder(cls, tuple(f.name for f in dataclasses.fields(cls)))


def frozen_init(cls):
    """Class decorator, above ``@dataclass(frozen=True, slots=True)``: the same class,
    its ``__init__`` compiled. Refuses (TypeError) a class it would not build alike:
    not a frozen slotted dataclass, or with fields outside ``__init__``, keyword-only
    fields, default factories or init-only variables."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} is not a frozen slotted dataclass")
    fields = dataclasses.fields(cls)
    for f in fields:
        if not f.init or f.kw_only or f.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{f.name}: only plain positional fields")
    names = tuple(f.name for f in fields)
    if tuple(inspect.signature(cls.__init__).parameters) != ("self", *names):
        raise TypeError(f"{cls.__name__}.__init__ takes more than its fields")
    scope = {"_write": _SlotWriter(cls, names)}
    parameters = []
    for f in fields:
        if f.default is dataclasses.MISSING:
            parameters.append(f.name)
        else:
            scope[f"_default_{f.name}"] = f.default
            parameters.append(f"{f.name}=_default_{f.name}")
    values = "".join(f"{name}, " for name in names)
    body = f"    _write(self, ({values}))\n"
    if hasattr(cls, "__post_init__"):
        body += "    self.__post_init__()\n"
    source = f"def __init__(self, {', '.join(parameters)}):\n{body}"
    exec(source, scope)
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init
    return cls
