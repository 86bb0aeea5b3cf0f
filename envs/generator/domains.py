"""Domain templates of the builtin generator: the vocabulary of each database-backed environment.

Every generated environment has EnvScaler's relational skeleton: *actor* (staff users with
roles), *person* (guests, patients, members...), *resource* (rooms, beds, vehicles...) and *record*
(a person holding a resource: reservations, admissions, loans...). A template names these, their
fields and values, so code, tools, instructions and checks read like the domain.

May import: the standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Domain:
    key: str                      # short id used in env ids: env_007_clinic
    system: str                   # class-name stem, e.g. "HotelReservation" -> HotelReservationSystem
    label: str                    # human domain name recorded in metadata
    user: tuple[str, str]         # actor singular, table name
    roles: tuple[str, str]        # (ordinary role, supervisor role allowed to do protected edits)
    person: tuple[str, str, str]  # singular, table, id prefix
    tier_field: str
    tiers: tuple[str, ...]
    balance_field: str            # must be 0 for the person to be eligible for a new record
    resource: tuple[str, str, str]
    label_field: str
    label_fmt: str                # format with {n}: how a resource is named in instructions
    category_field: str
    categories: tuple[str, ...]
    resource_status: tuple[str, str, str]  # (free, in use, out of service)
    record: tuple[str, str, str]
    record_status: tuple[str, str]         # (active, cancelled)
    quantity_field: str
    create_verb: str
    transfer_verb: str


def _d(*a) -> Domain:
    return Domain(*a)


DOMAINS: tuple[Domain, ...] = (
    _d("hotel", "HotelReservation", "hotel bookings", ("clerk", "staff"), ("receptionist", "manager"),
       ("guest", "guests", "G"), "loyalty_tier", ("standard", "silver", "gold", "platinum"),
       "outstanding_balance", ("room", "rooms", "RM"), "room_number", "Room {n}", "room_type",
       ("single", "double", "suite"), ("available", "occupied", "maintenance"),
       ("reservation", "reservations", "RS"), ("confirmed", "cancelled"), "nights", "book", "move"),
    _d("clinic", "HospitalBed", "clinics", ("clinician", "clinicians"), ("nurse", "charge_nurse"),
       ("patient", "patients", "PT"), "care_level", ("routine", "intermediate", "intensive"),
       "unpaid_copay", ("bed", "beds", "BD"), "bed_code", "Bed {n}", "ward",
       ("cardiology", "oncology", "orthopedics", "general"), ("vacant", "occupied", "blocked"),
       ("admission", "admissions", "AD"), ("admitted", "discharged"), "expected_days", "admit",
       "transfer"),
    _d("library", "LibraryCirculation", "libraries", ("librarian", "librarians"),
       ("assistant", "head_librarian"), ("member", "members", "MB"), "membership_type",
       ("basic", "student", "premium"), "unpaid_fines", ("copy", "copies", "CP"), "barcode_label",
       "Copy {n}", "genre", ("fiction", "history", "science", "children"),
       ("on_shelf", "on_loan", "in_repair"), ("loan", "loans", "LN"), ("open", "returned"),
       "loan_weeks", "issue", "reassign"),
    _d("fleet", "FleetDispatch", "fleet management", ("dispatcher", "dispatchers"),
       ("dispatcher", "fleet_supervisor"), ("driver", "drivers", "DR"), "license_class",
       ("B", "C", "CE"), "pending_penalties", ("vehicle", "vehicles", "VH"), "plate_number",
       "Truck {n}", "vehicle_class", ("van", "box_truck", "tractor"),
       ("parked", "dispatched", "in_service"), ("assignment", "assignments", "AS"),
       ("active", "closed"), "shift_hours", "assign", "swap"),
    _d("hr", "WorkforceStaffing", "HR", ("hr_officer", "hr_officers"), ("coordinator", "hr_director"),
       ("employee", "employees", "EM"), "grade", ("G1", "G2", "G3", "G4"), "open_grievances",
       ("position", "positions", "PS"), "position_title", "Position {n}", "department",
       ("finance", "engineering", "sales", "operations"), ("open", "filled", "frozen"),
       ("placement", "placements", "PL"), ("current", "ended"), "fte_percent", "place", "rotate"),
    _d("banking", "SafeDepositBank", "banking", ("banker", "bankers"), ("teller", "branch_manager"),
       ("customer", "customers", "CU"), "account_tier", ("basic", "plus", "private"),
       "overdue_fees", ("box", "boxes", "BX"), "box_number", "Box {n}", "box_size",
       ("small", "medium", "large"), ("free", "rented", "sealed"), ("rental", "rentals", "RN"),
       ("active", "terminated"), "months", "rent", "relocate"),
    _d("insurance", "InsuranceClaims", "insurance policies", ("agent", "agents"),
       ("claims_agent", "claims_manager"), ("policyholder", "policyholders", "PH"), "coverage_level",
       ("bronze", "silver", "gold"), "unpaid_premium", ("adjuster", "adjusters", "AJ"),
       "adjuster_name", "Adjuster {n}", "specialty", ("auto", "home", "health", "travel"),
       ("available", "assigned", "on_leave"), ("claim", "claims", "CL"), ("open", "withdrawn"),
       "amount_claimed", "file", "reassign"),
    _d("inventory", "WarehouseInventory", "inventory", ("operator", "operators"),
       ("picker", "warehouse_lead"), ("supplier", "suppliers", "SP"), "supplier_rating",
       ("C", "B", "A"), "disputed_invoices", ("bin", "bins", "BN"), "bin_code", "Bin {n}",
       "zone", ("cold", "dry", "bulk", "hazmat"), ("empty", "filled", "quarantined"),
       ("lot", "lots", "LT"), ("stored", "shipped"), "units", "store", "rebin"),
    _d("venue", "EventVenueBooking", "event venues", ("planner", "planners"),
       ("coordinator", "venue_manager"), ("organizer", "organizers", "OG"), "client_status",
       ("new", "regular", "vip"), "unpaid_deposits", ("hall", "halls", "HL"), "hall_name",
       "Hall {n}", "hall_size", ("small", "medium", "grand"), ("free", "booked", "closed"),
       ("event", "events", "EV"), ("scheduled", "called_off"), "guest_count", "schedule",
       "relocate"),
    _d("housing", "CampusHousing", "student housing", ("warden", "wardens"),
       ("resident_assistant", "housing_director"), ("student", "students", "ST"), "year_level",
       ("first", "second", "final"), "unpaid_rent", ("dorm_room", "dorm_rooms", "DM"),
       "door_label", "Door {n}", "building", ("north", "south", "east"),
       ("vacant", "occupied", "closed"), ("contract", "contracts", "CT"),
       ("signed", "terminated"), "semesters", "sign", "reassign"),
    _d("veterinary", "PetBoarding", "veterinary boarding", ("vet_tech", "vet_techs"),
       ("technician", "kennel_manager"), ("owner", "owners", "OW"), "client_tier",
       ("standard", "preferred"), "unpaid_invoices", ("kennel", "kennels", "KN"), "kennel_tag",
       "Kennel {n}", "kennel_size", ("small", "medium", "large"), ("empty", "occupied", "cleaning"),
       ("stay", "stays", "SY"), ("boarding", "cancelled"), "nights", "board", "move"),
    _d("coworking", "CoworkingDesk", "coworking spaces", ("host", "hosts"),
       ("host", "community_manager"), ("member", "members", "MM"), "plan", ("flex", "fixed", "team"),
       "unpaid_invoices", ("desk", "desks", "DK"), "desk_label", "Desk {n}", "floor_area",
       ("quiet", "open", "window"), ("free", "taken", "out_of_order"), ("desk_booking",
       "desk_bookings", "DB"), ("active", "cancelled"), "days", "reserve", "switch"),
    _d("carrental", "CarRental", "car rental", ("rental_agent", "rental_agents"),
       ("agent", "station_manager"), ("renter", "renters", "RT"), "rewards_level",
       ("blue", "silver", "gold"), "unpaid_damages", ("car", "cars", "CR"), "plate",
       "Car {n}", "car_class", ("compact", "sedan", "suv"), ("on_lot", "rented", "servicing"),
       ("rental", "rentals", "RL"), ("active", "cancelled"), "days", "rent", "swap"),
    _d("helpdesk", "ITHelpdesk", "IT helpdesk", ("service_lead", "service_leads"),
       ("dispatcher", "service_manager"), ("requester", "requesters", "RQ"), "priority_class",
       ("low", "normal", "high"), "overdue_surveys", ("technician", "technicians", "TC"),
       "tech_handle", "Tech {n}", "skill", ("network", "hardware", "accounts"),
       ("idle", "busy", "off_shift"), ("ticket", "tickets", "TK"), ("open", "withdrawn"),
       "estimated_hours", "open", "hand_over"),
    _d("marina", "MarinaBerth", "marinas", ("harbourmaster", "harbourmasters"),
       ("dockhand", "harbour_chief"), ("boat_owner", "boat_owners", "BO"), "member_class",
       ("visitor", "seasonal", "annual"), "unpaid_dues", ("berth", "berths", "BT"), "berth_code",
       "Berth {n}", "pier", ("A", "B", "C"), ("empty", "moored", "dredging"),
       ("mooring", "moorings", "MR"), ("active", "ended"), "weeks", "moor", "shift"),
    _d("equipment", "EquipmentLeasing", "equipment leasing", ("leasing_officer", "leasing_officers"),
       ("officer", "leasing_manager"), ("client", "clients", "CLT"), "credit_band",
       ("C", "B", "A"), "overdue_payments", ("machine", "machines", "MC"), "serial_label",
       "Machine {n}", "machine_type", ("excavator", "loader", "crane"),
       ("in_yard", "leased", "in_repair"), ("lease", "leases", "LS"), ("running", "terminated"),
       "weeks", "lease", "substitute"),
)

BRANDS = ("", "Harbor", "Summit", "Meridian", "Northwind", "Bluestone", "Cedar", "Atlas", "Lumen",
          "Pioneer", "Crescent", "Redwood", "Orion", "Silverline", "Juniper", "Keystone")

FIRST_NAMES = ("Ana", "Ben", "Carolyn", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jamal",
               "Kira", "Luis", "Marta", "Nikos", "Olga", "Pavel", "Quinn", "Rosa", "Samir", "Tara",
               "Umar", "Vera", "Wen", "Ximena", "Yusuf", "Zoe", "Aidan", "Bianca", "Chen", "Dalia",
               "Emeka", "Fiona", "Goran", "Hana", "Ivan", "Julia", "Kwame", "Lena", "Mateo", "Nadia")
LAST_NAMES = ("Diaz", "Ho", "Okafor", "Fong", "Novak", "Schmidt", "Kowalski", "Tanaka", "Haddad",
              "Moreau", "Silva", "Brennan", "Ivanova", "Mendes", "Larsen", "Quist", "Rahman",
              "Sato", "Bauer", "Costa", "Nguyen", "Petrov", "Weber", "Yilmaz", "Abbott", "Lindqvist",
              "Ortega", "Park", "Rossi", "Varga")

# Alternative vocabulary (person word, record word) used by every other round of templates, so
# environments past the first 16 differ in their entity names and not only in tool-name style.
ALT_VOCAB = {
    "hotel": ("visitor", "booking"), "clinic": ("inpatient", "stay"),
    "library": ("patron", "checkout"), "fleet": ("operator", "dispatch"),
    "hr": ("staffer", "posting"), "banking": ("client", "lease"),
    "insurance": ("insured", "case"), "inventory": ("vendor", "batch"),
    "venue": ("host", "function"), "housing": ("resident", "tenancy"),
    "veterinary": ("client", "booking"), "coworking": ("tenant", "reservation"),
    "carrental": ("driver", "booking"), "helpdesk": ("employee", "case"),
    "marina": ("skipper", "berthing"), "equipment": ("customer", "contract"),
}
_PLURALS = {"dispatch": "dispatches", "batch": "batches", "tenancy": "tenancies"}


def alternative(d: Domain) -> Domain:
    """``d`` with its person and record renamed (tables, id columns, instructions, tools)."""
    person, record = ALT_VOCAB[d.key]
    return replace(d, person=(person, f"{person}s", d.person[2]),
                   record=(record, _PLURALS.get(record, f"{record}s"), d.record[2]))
