"""BFCL's single-turn AST verdict, for Python-typed categories: the code of a BFCL task's check.

``bfcl_verdict(calls, functions, answer, kind) -> {"valid": bool, "error": [...], ...}`` decides a
recorded episode the way ``bfcl_eval/eval_checker/ast_eval/ast_checker.py`` (bfcl-eval 2026.3.23)
decides a decoded model output, for ``Language.PYTHON`` and a model that keeps BFCL's function
names (the recorder records BFCL's name, whatever the tool was called):

- ``kind`` ``simple``: exactly one call, checked by ``simple_function_checker``; ``multiple``: as
  many calls as answers (one), checked against the answer's function; ``parallel``: as many
  calls as answers, matched without order (greedily, answer by answer, first unmatched call that
  passes, exactly as BFCL: no search for a better matching); ``irrelevance``: valid when no call
  was made; ``relevance``: valid when one was.
- per call: the function name; every required parameter present; no parameter outside the doc
  or the answer; the type (``PYTHON_TYPE_MAPPING``, an ``int`` promoted to ``float`` where the
  doc says ``float``, a ``str`` accepted where the answer holds a str for a non-str type: a
  "variable"; one level of nested item types); the value among the accepted ones, strings
  compared after ``standardize_string`` (spaces and ``,./-_*^`` removed, lower case, ``'`` ->
  ``"``), in lists and dicts too; every answer parameter without ``""`` among its values present.

This file is written to run anywhere: its source is embedded in every BFCL check
(``single_turn.check_code``), so it imports only ``re`` and never anything of this project. The
error texts are BFCL's. ``tests/envs/test_bfcl_verdicts.py`` compares its verdicts with the
official checker's (run in a throwaway subprocess) on the same inputs.

May import: re (only).
"""

import re

PYTHON_TYPE_MAPPING = {"string": str, "integer": int, "float": float, "boolean": bool,
                       "array": list, "tuple": list, "dict": dict, "any": str}
PYTHON_NESTED_TYPE_CHECK_LIST = ["array", "tuple"]


def bfcl_verdict(calls, functions, answer, kind):
    """The verdict of ``calls`` (``[{"name", "arguments"}]``, in call order) for one task."""
    output = [{c["name"]: c["arguments"]} for c in calls]
    if kind == "irrelevance":
        return _result(not output, "irrelevance_error:decoder_success")
    if kind == "relevance":
        return _result(bool(output), "relevance_error:decoder_failed")
    if kind == "parallel":
        return parallel_no_order(functions, output, answer)
    wanted = len(answer) if kind == "multiple" else 1
    if len(output) != wanted:
        return {"valid": False, "error": ["Wrong number of functions."],
                "error_type": f"{kind}_function_checker:wrong_count"}
    expected = list(answer[0].keys())[0]
    doc = functions[0] if kind == "simple" else find_description(functions, expected)
    return simple_function_checker(doc, output[0], answer[0])


def _result(ok, error_type):
    return {"valid": True, "error": []} if ok else {"valid": False, "error": [error_type],
                                                   "error_type": error_type}


def find_description(functions, name):
    for doc in functions:
        if doc["name"] == name:
            return doc
    return None


def get_possible_answer_type(possible_answer):
    for answer in possible_answer:
        if answer != "":
            return type(answer)
    return None


def type_checker(param, value, possible_answer, expected_type_description,
                 expected_type_converted, nested_type_converted):
    result = {"valid": True, "error": [], "is_variable": False, "error_type": "type_error:simple"}
    is_variable = False
    possible_answer_type = get_possible_answer_type(possible_answer)
    if possible_answer_type is not None and possible_answer_type != expected_type_converted:
        is_variable = True
    if type(value) == expected_type_converted:
        if nested_type_converted is None:
            result["is_variable"] = is_variable
            return result
        for possible_answer_item in possible_answer:
            flag = True
            if type(possible_answer_item) == list:
                for value_item in value:
                    checked = type_checker(param, value_item, possible_answer_item,
                                           str(nested_type_converted), nested_type_converted,
                                           None)
                    if not checked["valid"]:
                        flag = False
                        break
            if flag:
                return {"valid": True, "error": [], "is_variable": is_variable}
        result["valid"] = False
        result["error"] = [f"Nested type checking failed for parameter {param!r}."]
        result["error_type"] = "type_error:nested"
    if possible_answer_type is not None and type(value) == possible_answer_type:
        result["is_variable"] = True
        return result
    result["valid"] = False
    result["error"].append(f"Incorrect type for parameter {param!r}. Expected type "
                           f"{expected_type_description}, got {type(value).__name__}.")
    result["error_type"] = "type_error:simple"
    return result


def standardize_string(input_string):
    return re.sub(r"[ \,\.\/\-\_\*\^]", "", input_string).lower().replace("'", '"')


def string_checker(param, model_output, possible_answer):
    accepted = [standardize_string(a) for a in possible_answer if type(a) == str]
    if standardize_string(model_output) not in accepted:
        return {"valid": False, "error": [f"Invalid value for parameter {param!r}: "
                                          f"{model_output!r}."],
                "error_type": "value_error:string"}
    return {"valid": True, "error": []}


def list_checker(param, model_output, possible_answer):
    got = [standardize_string(v) if type(v) == str else v for v in model_output]
    accepted = [[standardize_string(v) if type(v) == str else v for v in a]
                for a in possible_answer]
    if got not in accepted:
        return {"valid": False, "error": [f"Invalid value for parameter {param!r}: "
                                          f"{model_output!r}."],
                "error_type": "value_error:list/tuple"}
    return {"valid": True, "error": []}


def dict_checker(param, model_output, possible_answers):
    result = {"valid": False, "error": [], "error_type": "dict_checker:unclear"}
    for possible_answer in possible_answers:
        if possible_answer == "":
            continue
        result = {"valid": False, "error": [], "error_type": "dict_checker:unclear"}
        flag = True
        for key, value in model_output.items():
            if key not in possible_answer:
                result["error"].append(f"Unexpected dict key parameter: '{key}'.")
                result["error_type"] = "value_error:dict_key"
                flag = False
                break
            got = standardize_string(value) if type(value) == str else value
            accepted = [standardize_string(a) if type(a) == str else a
                        for a in possible_answer[key]]
            if got not in accepted:
                result["error"].append(f"Invalid value for parameter {key!r}: {value!r}.")
                result["error_type"] = "value_error:dict_value"
                flag = False
                break
        for key, value in possible_answer.items():
            if key not in model_output and "" not in value:
                result["error"].append(f"Missing dict key parameter: '{key}'.")
                result["error_type"] = "value_error:dict_key"
                flag = False
                break
        if flag:
            return {"valid": True, "error": []}
    return result


def list_dict_checker(param, model_output, possible_answers):
    result = {"valid": False, "error": [], "error_type": "list_dict_checker:unclear"}
    for candidate in possible_answers:
        flag = True
        if len(model_output) != len(candidate):
            result = {"valid": False, "error": ["Wrong number of dictionaries in the list."],
                      "error_type": "value_error:list_dict_count"}
            continue
        for k in range(len(model_output)):
            result = dict_checker(param, model_output[k], [candidate[k]])
            if not result["valid"]:
                flag = False
                break
        if flag:
            return {"valid": True, "error": []}
    return result


def _fail(message, error_type):
    return {"valid": False, "error": [message], "error_type": error_type}


def simple_function_checker(func_description, model_output, possible_answer):
    possible_answer = list(possible_answer.values())[0]
    func_name = func_description["name"]
    param_details = func_description["parameters"]["properties"]
    required_params = func_description["parameters"]["required"]
    if func_name not in model_output:
        return _fail(f"Function name {func_name!r} not found in model output.",
                     "simple_function_checker:wrong_func_name")
    model_params = model_output[func_name]
    for param in required_params:
        if param not in model_params:
            return _fail(f"Missing required parameter: {param!r}.",
                         "simple_function_checker:missing_required")
    for param, value in model_params.items():
        if param not in param_details or param not in possible_answer:
            return _fail(f"Unexpected parameter: {param!r}.",
                         "simple_function_checker:unexpected_param")
        expected_type_description = param_details[param]["type"]
        nested_type_converted = None
        expected_type_converted = PYTHON_TYPE_MAPPING[expected_type_description]
        if expected_type_description in PYTHON_NESTED_TYPE_CHECK_LIST:
            nested_type_converted = PYTHON_TYPE_MAPPING[param_details[param]["items"]["type"]]
        if expected_type_description == "tuple" and type(value) == tuple:
            value = list(value)
        if expected_type_description == "float" and type(value) == int:
            value = float(value)
        checked = type_checker(param, value, possible_answer[param], expected_type_description,
                               expected_type_converted, nested_type_converted)
        if not checked["valid"]:
            return checked
        if not checked["is_variable"]:
            sub = None
            if expected_type_converted == dict:
                sub = dict_checker(param, value, possible_answer[param])
            elif expected_type_converted == list and nested_type_converted == dict:
                sub = list_dict_checker(param, value, possible_answer[param])
            elif expected_type_converted == str:
                sub = string_checker(param, value, possible_answer[param])
            elif expected_type_converted == list:
                sub = list_checker(param, value, possible_answer[param])
            if sub is not None:
                if not sub["valid"]:
                    return sub
                continue
        if value not in possible_answer[param]:
            return _fail(f"Invalid value for parameter {param!r}: {value!r}.",
                         "value_error:others")
    for param in possible_answer:
        if param not in model_params and "" not in possible_answer[param]:
            return _fail(f"Optional parameter {param!r} not provided and not marked as "
                         f"optional.", "simple_function_checker:missing_optional")
    return {"valid": True, "error": []}


def parallel_no_order(functions, model_output, possible_answers):
    if len(model_output) != len(possible_answers):
        return _fail("Wrong number of functions.",
                     "parallel_function_checker_no_order:wrong_count")
    matched = []
    result = {"valid": True, "error": []}
    for i in range(len(possible_answers)):
        doc = find_description(functions, list(possible_answers[i].keys())[0])
        for index in range(len(model_output)):
            if index in matched:
                continue
            result = simple_function_checker(doc, model_output[index], possible_answers[i])
            if result["valid"]:
                matched.append(index)
                break
        if not result["valid"]:
            return _fail(f"Could not find a matching function for index {i} of possible "
                         f"answers.", "parallel_function_checker_no_order:cannot_find_match")
    return {"valid": True, "error": []}
