# cython: language_level=3
"""For the compiled core only (``cimport``-ed by engine/_batch_c.pyx and protocol/_render_c.pyx): a msgspec Struct made as
its constructor makes it, without calling it (a Python-level call that matches its arguments to
the fields): allocated by the type's own ``tp_alloc`` (zeroed, the type's reference taken, not
tracked), each slot set at its member's offset, the fields not given their defaults.

Only where the class's constructor does no more than that (:func:`plain_struct`: no
``__post_init__``, not tracked, no cached hash, the given fields first, every other default a plain
value) and one instance made each way at import is the same (:func:`maker_init`); otherwise the
class is called (``Maker.direct`` says which). A .pxd holds no module-level state: the caller keeps
the classes and defaults alive (``held``), passes msgspec's Struct metaclass, and says where a field
lives (``slot_offset``: :func:`member_slot`, or the parse's, which knows the tokens core's field)."""

from cpython.object cimport PyObject, PyTypeObject

from kvgateway.engine._slots cimport class_attribute, is_member, member_offset  # where a Struct keeps a field

cdef extern from "Python.h":
    int Py_TPFLAGS_HAVE_GC, Py_TPFLAGS_IS_ABSTRACT
    int PyObject_GC_IsTracked(object)
    void kv_direct_incref "Py_INCREF"(PyObject*)
    object kv_direct_vectorcall "PyObject_Vectorcall"(object callable, PyObject** args, size_t nargsf, PyObject* kwnames)

cdef extern from *:
    """
    /* A msgspec Struct allocated as its constructor allocates it (msgspec's Struct_alloc): the
       type's tp_alloc, which zeroes it (every slot empty) and takes a reference to the type. */
    static inline PyObject *kv_direct_alloc(PyObject *cls) {
        PyTypeObject *t = (PyTypeObject *)cls;
        return t->tp_alloc(t, t->tp_itemsize);
    }
    """
    object kv_direct_alloc(object cls)

cdef enum:
    MAX_DIRECT_FIELDS = 12  # the most fields a Struct made here may have

ctypedef Py_ssize_t (*SlotOffset)(object cls, str name) except -2  # a field's slot offset, or -1


cdef inline Py_ssize_t member_slot(object cls, str name) except -2:
    """Where ``cls``'s instances keep the field ``name``: its member descriptor's offset; -1 where
    it has none."""
    member = class_attribute(cls, name)
    if member is None or not is_member(member):
        return -1
    return member_offset(member)


cdef struct Maker:
    # how one Struct class is made: called with the given fields, in their order, or (``direct``)
    # allocated as its constructor allocates it and each slot set: the given fields', then the
    # defaults of the rest
    PyObject* cls  # held by the caller
    bint direct
    int given, count
    Py_ssize_t offsets[MAX_DIRECT_FIELDS]  # each field's slot, in the class's field order
    PyObject* defaults[MAX_DIRECT_FIELDS]  # the fields' after ``given``: their defaults (held by the caller)


cdef inline bint plain_struct(object cls, tuple given, object meta) except -1:
    """Whether ``cls``'s constructor does no more than its allocation and its slots set: a Struct
    (of the metaclass ``meta``) taking ``given`` as its first fields, every further one's default a
    str, int, float, bool, bytes or None (the same object set each time); not tracked by the
    collector, no weak references, no __dict__, no cached hash, no __post_init__, not abstract, no
    items."""
    if type(cls) is not meta or not isinstance(cls, type):
        return False
    fields, defaults = cls.__struct_fields__, cls.__struct_defaults__
    config = cls.__struct_config__  # (an option an older msgspec lacks is one it does not have)
    if getattr(config, "gc", True):
        return False
    for name in ("weakref", "dict", "cache_hash"):
        if getattr(config, name, False):
            return False
    if getattr(cls, "__post_init__", None) is not None or (<PyTypeObject*>cls).tp_itemsize != 0:
        return False
    if (<PyTypeObject*>cls).tp_flags & (Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IS_ABSTRACT):
        return False
    if len(fields) > MAX_DIRECT_FIELDS or tuple(fields[: len(given)]) != given:
        return False
    if len(defaults) < len(fields) - len(given):
        return False
    for default in defaults[len(defaults) - (len(fields) - len(given)):]:
        if type(default) not in (str, int, float, bool, bytes, type(None)):
            return False
    return True


cdef inline int maker_init(
    Maker* maker, object cls, tuple given, list held, object meta, SlotOffset slot_offset
) except -1:
    """How ``cls`` is made (see :c:type:`Maker`): directly where :func:`plain_struct` says its
    constructor only allocates and sets, ``slot_offset`` finds every slot, and one instance made
    each way from the same values is the same (type, each field the same object, ``repr``, not
    tracked: ``==`` follows from the fields where a class compares, and is identity where not)."""
    cdef Py_ssize_t i, count
    cdef PyObject* values[MAX_DIRECT_FIELDS]
    held.append(cls)
    maker.cls, maker.direct, maker.given, maker.count = <PyObject*>cls, False, len(given), len(given)
    if not plain_struct(cls, given, meta):
        return 0
    fields, defaults = cls.__struct_fields__, cls.__struct_defaults__
    count = len(fields)
    for i in range(count):
        maker.offsets[i] = slot_offset(cls, fields[i])
        if maker.offsets[i] < 0:
            return 0
        if i >= maker.given:
            default = defaults[len(defaults) - count + i]
            held.append(default)
            maker.defaults[i] = <PyObject*>default
    maker.count = <int>count
    samples = []
    for i in range(maker.given):
        samples.append(object())
        values[i] = <PyObject*>samples[i]
    called = cls(*samples)
    maker.direct = True
    try:
        made = make(maker, values)
        same = type(made) is type(called) and shown(made) == shown(called) and not PyObject_GC_IsTracked(made)
        for name in fields:
            same = same and getattr(made, name) is getattr(called, name)
        maker.direct = same
    except Exception:  # a slot left empty reads as an AttributeError: the constructor, then
        maker.direct = False
    return 0


cdef inline object shown(object made):
    """``repr(made)``, or the type of what it raised (a class's own ``__repr__`` may not take the
    sample values :func:`maker_init` gives)."""
    try:
        return repr(made)
    except Exception as exc:
        return type(exc)


cdef inline object make(Maker* maker, PyObject** values):
    """An instance of the maker's class of the given fields ``values`` (as many as it is given)."""
    cdef int i
    cdef char* at
    cdef PyObject* value
    if not maker.direct:
        return kv_direct_vectorcall(<object>maker.cls, values, maker.given, NULL)
    made = kv_direct_alloc(<object>maker.cls)
    at = <char*><PyObject*>made
    for i in range(maker.count):
        value = values[i] if i < maker.given else maker.defaults[i]
        kv_direct_incref(value)
        (<PyObject**>(at + maker.offsets[i]))[0] = value
    return made
