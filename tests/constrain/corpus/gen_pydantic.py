#!/usr/bin/python3
"""Regenerates pydantic.json: JSON Schemas as Debian's python3-pydantic (1.10)
emits them (Model.schema()) for the common field types of tool and
structured-output models. Run: /usr/bin/python3 gen_pydantic.py > pydantic.json"""
import datetime
import enum
import json
import typing
import uuid

from pydantic import BaseModel, Field, conint, conlist, constr


class Unit(str, enum.Enum):
    celsius = "celsius"
    fahrenheit = "fahrenheit"


class Address(BaseModel):
    street: str
    city: str
    zip: constr(regex=r"^[0-9]{5}$")


class Weather(BaseModel):
    location: str = Field(..., description="City and country")
    unit: Unit = Unit.celsius
    days: conint(ge=1, le=14) = 3


class Person(BaseModel):
    name: constr(min_length=1, max_length=64)
    age: typing.Optional[conint(ge=0)] = None
    tags: typing.List[str] = []
    address: Address
    previous: typing.List[Address] = []


class Event(BaseModel):
    id: uuid.UUID
    when: datetime.datetime
    day: datetime.date
    kind: typing.Literal["meeting", "call"]
    score: typing.Union[int, str]
    weights: typing.Dict[str, float]
    pair: typing.Tuple[int, str]
    flags: conlist(bool, min_items=1, max_items=3)


class Tree(BaseModel):
    label: str
    children: typing.List["Tree"] = []


Tree.update_forward_refs()

out = [{"name": "pydantic/" + m.__name__, "schema": m.schema()} for m in (Weather, Person, Event, Tree)]
print(json.dumps(out, indent=1))
